"""Credentials out of everything c2lip writes or prints.

Tracking URIs carry passwords (``postgresql://user:pass@host/db``, ``https://user:token@mlflow``) and
table URLs carry signed query strings (``?X-Amz-Signature=...``, ``?sig=...``). Both end up in error
messages, logs, metrics/captions.json (committed) and every sample's json unless removed here.
"""

from __future__ import annotations

import re

# scheme://user[:password]@ -> scheme://***@
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'\"]+@")
# the query of an http(s) URL: signatures, tokens and keys live there
_QUERY = re.compile(r"(?P<url>\bhttps?://[^\s?#'\"]+)\?[^\s#'\"]*")


def redact(text: str) -> str:
    """``text`` with every URL's user name and password, and every http(s) URL's query string, replaced."""
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", str(text))
    return _QUERY.sub(lambda m: f"{m.group('url')}?<redacted>", text)


def one_line(err: BaseException, limit: int = 300) -> str:
    """An exception as one short, redacted line for an error message: its first non-empty line, else its type."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return redact(lines[0][:limit]) if lines else type(err).__name__
