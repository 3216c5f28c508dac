"""Small socket helpers shared by both directions of the TCP transport."""

from __future__ import annotations

import asyncio
import contextlib
import socket


def set_nodelay(writer: asyncio.StreamWriter) -> None:
    """Send small frames (one decode step) now, not after Nagle's 40 ms."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def close_quietly(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, asyncio.TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 1.0)
