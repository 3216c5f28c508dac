"""Send a frame to a node by id: over the transport, or in-process when it is us."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from ..transport.base import Transport
from ..transport.errors import PeerUnreachable
from ..transport.frames import Frame

SEND_TIMEOUT_S = 10.0  # a peer that stops reading must not block a stage forever


class Router:
    def __init__(self, node_id: str, transport: Transport, address_of: Callable[[str], tuple[str, int] | None]):
        self.node_id = node_id
        self.transport = transport
        self.address_of = address_of
        self.local: Callable[[str, Frame], Awaitable[None]] | None = None  # set by the frame handler

    async def send(self, node_id: str, header: dict, payload: bytes | memoryview = b"") -> None:
        if node_id == self.node_id:
            await self.local(self.node_id, Frame(header, bytes(payload)))
            return
        address = self.address_of(node_id)
        if address is None:
            raise PeerUnreachable(node_id, "not in this node's view of the swarm")
        try:
            # asyncio.timeout, not wait_for: wait_for (3.11) runs the send in a new task, so the
            # frame would leave one event-loop iteration later, on every hop.
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await self.transport.send(node_id, address, header, payload)
        except TimeoutError:
            await self.transport.drop(node_id)  # a half-written frame leaves the stream unusable
            raise PeerUnreachable(node_id, f"send blocked for {SEND_TIMEOUT_S:.0f}s") from None
