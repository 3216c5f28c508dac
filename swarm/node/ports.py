"""The node's two listening ports, checked before anything slow happens.

A port another process holds (most often another swarm-node on this machine) is said in
one line naming the flag that chose it, before the model is converted or loaded, and the
same line comes if the port is lost in the moment between that check and the real bind.
"""

from __future__ import annotations

import errno
import os
import socket

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

