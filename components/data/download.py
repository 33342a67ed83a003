"""Fetching one image URL for the table source: retries with back-off, a size cap, a whole-download
deadline, and only public addresses (redirect targets included) unless ``download.allow_hosts`` names a
team's own mirror. Every failure is a counted :class:`~components.data.sources.Skip`, never an exception."""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from components.shared.params import DownloadParams


@dataclass
class Skip:
    """A source row that could not be used, with the reason it is counted under (defined here, where
    most reasons arise; every source uses it)."""

    reason: str
    detail: str = ""


def make_session(cfg: DownloadParams) -> requests.Session:
    """A requests session that retries connection errors and 429/5xx answers with exponential back-off."""
    retry = Retry(
        total=cfg.retries,
        connect=cfg.retries,
        read=cfg.retries,
        status=cfg.retries,
        backoff_factor=cfg.backoff_s,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=frozenset({"GET"}),
        raise_on_status=False,  # the last answer comes back and is counted as http_<status>
        respect_retry_after_header=True,
    )
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment: the connection must go to the checked address
    adapter = PinnedAddressAdapter(cfg, max_retries=retry, pool_connections=cfg.concurrency, pool_maxsize=cfg.concurrency)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers["User-Agent"] = cfg.user_agent
    return session


class RefusedAddress(requests.RequestException):
    """The URL's host is not a public address (or resolves to one that is not)."""


def checked_address(url: str, cfg: DownloadParams) -> tuple[str | None, str | None]:
    """(the address to connect to, None) or (None, why ``url`` must not be fetched), from ONE resolution of its
    host. Only http(s) to public addresses: a host any of whose addresses is loopback, private, link-local,
    multicast or reserved is refused (a table must not make the stage read this machine's or its network's
    services), unless ``allow_hosts`` names it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None, f"not an http(s) URL ({parts.scheme or 'no scheme'})"
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = [info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
    except (socket.gaierror, ValueError, UnicodeError) as err:
        return None, f"{host} does not resolve ({err})"
    if not addresses:
        return None, f"{host} does not resolve"
    for text in sorted(set(addresses)):
        address = ipaddress.ip_address(text.split("%")[0])
        if is_public(address) or _allowed(host, address, cfg.allow_hosts):
            continue
        return None, f"{host} is {address}, not a public address (download.allow_hosts admits a mirror)"
    return addresses[0].split("%")[0], None


# NAT64's well-known prefix carries an IPv4 address in its last 32 bits, which a translator reaches (RFC 6052); the
# local-use prefix (RFC 8215) is never globally reachable. Python 3.11 calls both global (64:ff9b::7f00:1 too).
NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL_USE = ipaddress.ip_network("64:ff9b:1::/48")


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """A global address, and so is every IPv4 address it embeds (IPv4-mapped, NAT64, 6to4): ``64:ff9b::7f00:1`` is
    127.0.0.1 to a NAT64 gateway, so it is as private as 127.0.0.1."""
    if not address.is_global:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        if address in NAT64_LOCAL_USE:
            return False
        embedded = [address.ipv4_mapped, address.sixtofour]
        if address in NAT64_WELL_KNOWN:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        return all(v4.is_global for v4 in embedded if v4 is not None)
    return True


def refused_address(url: str, cfg: DownloadParams) -> str | None:
    """Why ``url`` must not be fetched, or None (:func:`checked_address`)."""
    return checked_address(url, cfg)[1]


class PinnedAddressAdapter(HTTPAdapter):
    """An adapter that resolves each request's host once, checks the addresses (:func:`checked_address`) and
    connects to the address it checked. Letting urllib3 resolve the name again on connect would let a DNS
    server answer a public address for the check and a private one for the connection (DNS rebinding). The
    name stays in the Host header and, for HTTPS, in SNI and certificate verification."""

    def __init__(self, cfg: DownloadParams, **kwargs):
        self.cfg = cfg
        super().__init__(**kwargs)

    def build_connection_pool_key_attributes(self, request, verify, cert=None):
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, verify, cert)
        address, refused = checked_address(request.url, self.cfg)
        if refused:
            raise RefusedAddress(refused)
        host = host_params["host"]
        if address != host:
            request.headers["Host"] = urlsplit(request.url).netloc.rsplit("@", 1)[-1]
            host_params["host"] = address
            if host_params["scheme"] == "https":
                pool_kwargs["server_hostname"] = host
                pool_kwargs["assert_hostname"] = host
        return host_params, pool_kwargs


def _allowed(host: str, address, allow_hosts: list[str]) -> bool:
    for entry in allow_hosts:
        if entry.lower() == host.lower():
            return True
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def download(session: requests.Session, url: str, cfg: DownloadParams) -> bytes | Skip:
    """GET ``url`` within the size cap and the whole-download deadline, following redirects only to
    addresses :func:`refused_address` accepts; every failure becomes a :class:`Skip` with its reason."""
    deadline = time.monotonic() + cfg.deadline_s
    try:
        for _ in range(cfg.max_redirects + 1):
            # the session's adapter resolves the host once, checks it and connects to that address (PinnedAddressAdapter)
            if urlsplit(url).scheme not in ("http", "https"):  # a redirect to file:, ftp:, ...
                return Skip("refused_address", f"{url}: not an http(s) URL")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Skip("deadline", f"{url}: over {cfg.deadline_s} s")
            with session.get(url, stream=True, timeout=min(cfg.timeout_s, remaining), allow_redirects=False) as resp:
                if resp.is_redirect:
                    url = urljoin(url, resp.headers["Location"])
                    continue
                return _read_body(resp, url, cfg, deadline)
        return Skip("too_many_redirects", url)
    except RefusedAddress as refused:
        return Skip("refused_address", f"{url}: {refused}")
    except requests.Timeout:
        return Skip("timeout", url)
    except requests.exceptions.ConnectionError as err:
        # urllib3 wraps read timeouts met while retrying in a ConnectionError
        reason = "timeout" if "timed out" in str(err).lower() else "connection_error"
        return Skip(reason, url)
    except requests.RequestException as err:
        return Skip("request_error", f"{url}: {type(err).__name__}")
    except urllib3.exceptions.ReadTimeoutError:  # read1 reads urllib3's response directly: its errors are its own
        return Skip("timeout", url)
    except urllib3.exceptions.HTTPError as err:  # e.g. the connection closed before Content-Length bytes came
        return Skip("connection_error", f"{url}: {type(err).__name__}")


def _read_body(resp: requests.Response, url: str, cfg: DownloadParams, deadline: float) -> bytes | Skip:
    if resp.status_code != 200:
        return Skip(f"http_{resp.status_code}", url)
    length = resp.headers.get("Content-Length")
    if length is not None and length.isdigit() and int(length) > cfg.max_bytes:
        return Skip("too_large", f"{url}: Content-Length {length}")
    chunks, received = [], 0
    while True:
        if time.monotonic() > deadline:  # read1 returns what has arrived, so a dripping server is checked often
            return Skip("deadline", f"{url}: over {cfg.deadline_s} s")
        chunk = resp.raw.read1(65536, decode_content=True)
        if not chunk:
            return b"".join(chunks)
        received += len(chunk)
        if received > cfg.max_bytes:
            return Skip("too_large", f"{url}: over {cfg.max_bytes} bytes")
        chunks.append(chunk)
