"""Is an HTTP client on this node's own machine? Its source is loopback, or the very address it connected to.

A TCP connection from another machine cannot complete with a source address of this machine
(the answers would never leave it), so either is proof enough for what it is used for: such
a client needs no key derived from the swarm secret (auth.py) and is never refused for the
total of connections (connection_cap.py). A proxy on this machine makes every client look
local: such a setup wants an explicit --api-key.
"""

from __future__ import annotations

import asyncio
import ipaddress


def on_this_machine(transport: asyncio.BaseTransport | None) -> bool:
    if transport is None:
        return False
    peer, own = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
    if not peer or not isinstance(peer, tuple):
        return False
    try:
        if ipaddress.ip_address(peer[0]).is_loopback:
            return True
    except ValueError:
        return False
    return bool(own) and own[0] == peer[0]
