"""Which `Host` a request may name: this node's own names and addresses, never a stranger's.

DNS rebinding: a web page's own hostname (evil.example) is re-pointed at this machine, and the
browser, which thinks it talks to evil.example, lets the page read every answer. The request still
says `Host: evil.example`, so a node that only answers to its own names is safe from it (Ollama's
CVE-2024-28224 and its fix). Allowed:
- loopback names: `localhost`, `*.localhost`;
- IP addresses of this machine (loopback, every interface's; the list is read again when an
  address is not found, at most once a second, so a new DHCP lease is seen), IPv4-mapped ones too,
  and the any-address (0.0.0.0 and ::, since the node logs `API on 0.0.0.0:8800` and `curl 0.0.0.0:8800`
  reaches it; no rebinding name is an address);
- this machine's hostname, its fully qualified name, and `<hostname>.local` (mDNS);
- names given with --allowed-hosts / SWARM_ALLOWED_HOSTS (`*` allows any: behind a proxy that
  checks Host itself).
A request without a Host (HTTP/1.0) names nothing to rebind and is let through.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from typing import Iterable

import psutil

ANY = "*"
REREAD_AFTER_S = 1.0


def host_name(host_header: str) -> str:
    """`Host`'s name or address without the port or IPv6 brackets, lowercase, no trailing dot."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _own_addresses() -> set[str]:
    out = set()
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                out.add(a.address.partition("%")[0].lower())
    return out


def _machine_names() -> set[str]:
    names = set()
    for name in (socket.gethostname(), socket.getfqdn()):
        name = name.lower().rstrip(".")
        if name:
            names.update({name, f"{name.partition('.')[0]}.local"})
    return names


class HostPolicy:
    def __init__(self, extra: Iterable[str] = ()):
        given = {host_name(h) for h in extra if h.strip()}
        self.any = ANY in given
        self.names = (given - {ANY}) | {"localhost"} | _machine_names()
        self._addresses = _own_addresses()
        self._read_at = time.monotonic()

    def allows(self, host_header: str | None) -> bool:
        return self.any or not host_header or self.names_this_node(host_name(host_header))

    def names_this_node(self, host: str) -> bool:
        """`host` (no port) is one of this node's names or addresses (`*` aside)."""
        if host in self.names or host.endswith(".localhost"):
            return True
        try:
            address = ipaddress.ip_address(host.partition("%")[0])  # an IPv6 zone (fe80::1%eth0) aside
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        return address.is_loopback or address.is_unspecified or self._is_own(str(address))

    def _is_own(self, address: str) -> bool:
        if address in self._addresses:
            return True
        if time.monotonic() - self._read_at >= REREAD_AFTER_S:
            self._addresses, self._read_at = _own_addresses(), time.monotonic()
        return address in self._addresses
