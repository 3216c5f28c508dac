"""A peer link on the event loop: whole frames over asyncio streams.

For the exchanges that are not the data path and must not wait for the MLX
thread: weights, which move in bulk. (The data path is the MLX thread's lane.)
"""

from __future__ import annotations

import asyncio
import contextlib

from .frames import DEFAULT_MAX_PAYLOAD_BYTES, Frame, encode_frame, read_frame


class StreamFrameLink:
    def __init__(self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
        self.peer, self._reader, self._writer, self.max_payload = peer, reader, writer, max_payload

    async def send(self, header: dict, payload: bytes | memoryview = b"") -> None:
        self._writer.writelines(encode_frame(header, payload))
        await self._writer.drain()

    async def receive(self) -> Frame:
        """The next frame; ProtocolError (ConnectionClosed at a clean end) otherwise."""
        return await read_frame(self._reader, self.max_payload)

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)


# A weights link on the peer port: this magic, then frames both ways (weights/transfer.py).
# Issue 19 puts it behind the authenticated hello like every other peer link.
WEIGHTS_MAGIC = b"SWWT"


async def dial_weights(peer: str, address: tuple[str, int], timeout: float = 5.0) -> StreamFrameLink:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), timeout)
    writer.write(WEIGHTS_MAGIC)
    return StreamFrameLink(peer, reader, writer)
