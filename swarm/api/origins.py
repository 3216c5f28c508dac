"""Which web pages may call the API: an `Origin` header names the page that makes the request.

A browser adds `Origin` to every request a page makes to another site (and to every POST), and
lets any page POST a `text/plain` body or a form to any address without asking first. So a
request that carries an `Origin` is served only when that origin is allowed:
- by default, pages served from this machine's loopback (`http(s)://localhost:*`,
  `127.0.0.1:*`, `[::1]:*`, `*.localhost`) and the node's own API origins (its names and
  addresses at its API port);
- plus what --allowed-origins / SWARM_ALLOWED_ORIGINS give: `scheme://host[:port]`, a port `*`
  for any port, `*` for any origin (a page from anywhere: the mistake a default must not make).
`Origin: null` (sandboxed frames, file:// pages) is a stranger. Clients that send no Origin
(curl, the SDKs, agents, the dashboard) are not web pages and are unaffected.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable
from urllib.parse import urlsplit

from .hosts import HostPolicy, host_name

ANY = "*"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


class BadOrigin(ValueError):
    pass


def _parse(origin: str) -> tuple[str, str, str]:
    """(scheme, host, port) of an origin; port "" when none is given, "*" for any."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise BadOrigin(f"{origin!r} is not an origin (scheme://host[:port])")
    netloc = parts.netloc.lower()
    host, port = netloc, ""
    if netloc.startswith("["):
        host, _, rest = netloc.partition("]")
        host, port = host + "]", rest.removeprefix(":")
    elif ":" in netloc:
        host, _, port = netloc.partition(":")
    if port and port != ANY and not port.isdigit():
        raise BadOrigin(f"{origin!r}: the port must be a number or *")
    return parts.scheme, host_name(host), port


def _default_port(scheme: str) -> str:
    return "443" if scheme == "https" else "80"


def parse_allowed(values: Iterable[str]) -> list[str]:
    """The origins a user gave (comma-separated, flags repeatable); BadOrigin names a malformed one."""
    out = []
    for value in values:
        for item in value.split(","):
            if item.strip():
                if item.strip() != ANY:
                    _parse(item)
                out.append(item.strip())
    return out


class OriginPolicy:
    def __init__(self, api_port: int, hosts: HostPolicy, extra: Iterable[str] = ()):
        self.api_port, self.hosts = str(api_port), hosts
        given = list(extra)
        self.any = ANY in given
        self.allowed = [_parse(o) for o in given if o != ANY]

    def allows(self, origin: str) -> bool:
        if self.any:
            return True
        try:
            scheme, host, port = _parse(origin)
        except BadOrigin:
            return False  # "null", garbage
        port = port or _default_port(scheme)
        if _loopback(host):
            return True
        if port == self.api_port and scheme == "http" and self.hosts.names_this_node(host):
            return True  # a page of this node's own API origin
        return any(scheme == s and host == h and (p == ANY or port == (p or _default_port(s)))
                   for s, h, p in self.allowed)


def _loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
