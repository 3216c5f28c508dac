"""A peer link on the event loop: whole frames over asyncio streams, sealed when the swarm has a secret.

For the exchanges that are not the data path and must not wait for the MLX thread:
profiles and liveness (peer_profiles.py), weights (which move in bulk). The data path
is the MLX thread's lane.

Both ends come from handshake.py, never from here, so a link always carries a peer
that said hello (and proved the secret, with one):

    link = await dial_stream((host, port), auth, "weights", expected_peer=node_id,
                             max_payload=...)                        # the asking side
    listener.serve_purpose("weights", handler)                       # the answering side:
    async def handler(link: StreamFrameLink) -> None: ...            #   called with each link

`send` / `receive` / `close`; `detach` hands the socket to a worker thread for a bulk
transfer (thread_link.py: the same frames, without the event loop's copies). `receive`
raises ProtocolError (ConnectionClosed at a clean end), and on a sealed link a frame
that was altered, replayed or reordered is a ProtocolError too. An answered link's
`receive` gives up after `idle_timeout` with nothing (a stranger cannot hold one open
for free); the listener closes the link when its handler returns.
"""

from __future__ import annotations

import asyncio
import contextlib

from .errors import ProtocolError
from .frames import DEFAULT_MAX_PAYLOAD_BYTES, Frame, encode_frame, read_frame
from .sealed_frames import read_sealed_frame, seal_frame
from .thread_link import ThreadFrameLink


class StreamFrameLink:
    def __init__(self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES, *, cipher=None, idle_timeout: float | None = None) -> None:
        """`cipher` (link_handshake.LinkCipher) seals and opens every frame; None: plain frames."""
        self.peer, self._reader, self._writer, self.max_payload = peer, reader, writer, max_payload
        self._cipher, self.idle_timeout = cipher, idle_timeout

    @property
    def remote_host(self) -> str | None:
        """The other end's address."""
        peer = self._writer.get_extra_info("peername")
        return peer[0] if peer else None

    @property
    def sealed(self) -> bool:
        return self._cipher is not None

    async def send(self, header: dict, payload: bytes | memoryview = b"") -> None:
        cipher = self._cipher
        self._writer.writelines(encode_frame(header, payload) if cipher is None
                                else seal_frame(cipher.sealer, header, payload))
        await self._writer.drain()

    async def receive(self) -> Frame:
        """The next frame; ProtocolError (ConnectionClosed at a clean end) otherwise."""
        cipher = self._cipher
        read = (read_frame(self._reader, self.max_payload) if cipher is None
                else read_sealed_frame(self._reader, cipher.opener, self.max_payload))
        if self.idle_timeout is None:
            return await read
        try:
            return await asyncio.wait_for(read, self.idle_timeout)
        except asyncio.TimeoutError:
            raise ProtocolError(f"nothing from {self.peer} for {self.idle_timeout:.0f} s") from None

    async def detach(self, timeout: float) -> ThreadFrameLink:
        """The link as a ThreadFrameLink (owning a duplicate of the socket): from now on only that is
        used; close this one too when done. `timeout`: the longest any read or write of it may wait."""
        transport = self._writer.transport
        transport.set_write_buffer_limits(0)  # all we sent is out before the thread writes behind it
        await self._writer.drain()
        transport.pause_reading()
        # Frames the peer sent right behind the handshake may wait in the reader (no public accessor).
        pending = bytes(self._reader._buffer)
        self._reader._buffer.clear()
        sock = self._writer.get_extra_info("socket").dup()
        return ThreadFrameLink(self.peer, sock, self.max_payload, cipher=self._cipher, pending=pending,
                               timeout=timeout)

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)
