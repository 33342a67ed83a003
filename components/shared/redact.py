"""Credentials out of everything c2lip writes or prints.

Tracking URIs carry passwords (``postgresql://user:pass@host/db``, ``https://user:token@mlflow``) and
table URLs carry signed query strings (``?X-Amz-Signature=...``, ``?sig=...``). Both end up in error
messages, logs, metrics/captions.json (committed) and every sample's json unless removed here.
"""

from __future__ import annotations

import re

# scheme://user[:password]@ -> scheme://***@; up to the URL's last "@", so a password holding "@" or "/" goes whole
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s'\"<>]*@")
# the query of an http(s) URL: signatures, tokens and keys live there
_QUERY = re.compile(r"(?P<url>\bhttps?://[^\s?#'\"]+)\?[^\s#'\"]*")
# key=value secrets anywhere: a DSN's "password=…", another scheme's "?password=…", "token=…", "api_key=…", a variable
# such as MLFLOW_TRACKING_PASSWORD= or PREFECT_API_AUTH_STRING=, a JSON or repr pair ("password": "…", 'token': '…'),
# a quoted value with spaces, a value holding ";"
_KEY_VALUE = re.compile(r"(?i)(?P<key>(?<![A-Za-z0-9])[A-Za-z0-9_]*?(?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key"
                        r"|auth[_-]?string|sig|signature)[\"']?\s*[=:]\s*)"
                        r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s&,'\"]+)")
# a Hugging Face token on its own
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{20,}")
# "Authorization: Bearer …", "Basic …", "token …" credentials in a header or a message
_AUTH = re.compile(r"(?i)\b(?P<kind>bearer|basic)\s+[A-Za-z0-9._~+/=-]+")


def redact(text: str) -> str:
    """``text`` with every URL's user name and password, every http(s) URL's query string, every ``password=``-like
    value and every Bearer/Basic credential replaced."""
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", str(text))
    text = _QUERY.sub(lambda m: f"{m.group('url')}?<redacted>", text)
    text = _KEY_VALUE.sub(lambda m: f"{m.group('key')}<redacted>", text)
    text = _HF_TOKEN.sub("hf_<redacted>", text)
    return _AUTH.sub(lambda m: f"{m.group('kind')} <redacted>", text)


def one_line(err: BaseException, limit: int = 300) -> str:
    """An exception as one short, redacted line for an error message: its first non-empty line, else its type."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return redact(lines[0][:limit]) if lines else type(err).__name__
