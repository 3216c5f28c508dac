"""The node's two listening ports, checked before anything slow happens.

A port another process holds (most often another swarm-node on this machine) is said in
one line naming the flag that chose it, before the model is converted or loaded, and the
same line comes if the port is lost in the moment between that check and the real bind.
Once listening, reachable_urls says where a client finds the API.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket

import psutil

FLAGS = {"api": ("--api-host", "--api-port"), "peer": ("--peer-host", "--peer-port")}


class PortError(Exception):
    """One line for the user: which flag, which address, why."""


def check_port(kind: str, host: str, port: int) -> None:
    """Raise PortError if `host:port` cannot be listened on now (kind: "api" or "peer")."""
    try:
        # create_server sets SO_REUSEADDR as asyncio's servers do, so a port in TIME_WAIT passes
        # and only a port someone listens on fails, as the real bind would.
        socket.create_server((host, port)).close()
    except OSError as e:
        raise port_error(kind, host, port, e) from None


def port_error(kind: str, host: str, port: int, e: OSError) -> PortError:
    host_flag, port_flag = FLAGS[kind]
    why = os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0 else str(e)
    if e.errno == errno.EADDRINUSE:
        return PortError(f"{port_flag} {port}: {host}:{port} is already in use (is another swarm-node running "
                         f"on this machine?); stop it or choose another port with {port_flag}")
    if e.errno == errno.EACCES:
        return PortError(f"{port_flag} {port}: not allowed to listen on {host}:{port} (ports below 1024 need "
                         f"privileges); choose another with {port_flag}")
    if isinstance(e, socket.gaierror) or e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return PortError(f"{host_flag} {host}: cannot listen on this address ({why}); give an "
                         f"address of this machine with {host_flag}")
    return PortError(f"{port_flag} {port}: cannot listen on {host}:{port}: {why}")


def reachable_urls(host: str, port: int, path: str = "/v1") -> list[str]:
    """URLs a client can reach a server listening on host:port by: for a wildcard address, every
    address of this machine's interfaces (other machines' way in first, loopback last)."""
    if host not in ("0.0.0.0", "::", ""):
        return [_url(host, port, path)]
    # asyncio's servers set IPV6_V6ONLY: "::" takes IPv6 only, "" a socket per family
    families = {"0.0.0.0": {socket.AF_INET}, "::": {socket.AF_INET6}}.get(host, {socket.AF_INET, socket.AF_INET6})
    found = set()
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in families and "%" not in entry.address:
                address = ipaddress.ip_address(entry.address)
                if not address.is_link_local:  # an IPv6 link-local address needs its interface named
                    found.add(address)
    ordered = sorted(found, key=lambda a: (a.is_loopback, a.version, a))
    return [_url(str(a), port, path) for a in ordered] or [_url("::1" if host == "::" else "127.0.0.1", port, path)]


def _url(host: str, port: int, path: str) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"
