"""One persistent outgoing connection to a peer node.

Writes only, after the handshake: replies travel on the replier's own
outgoing connection (every node reads on accepted connections, writes on
its outgoing ones). A watcher task still reads this socket, for two reasons:
it notices the peer closing (so the next send reconnects instead of writing
into a dead socket), and anything the peer does send back is delivered to
on_message like any other frame rather than silently piling up.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Sequence

from .errors import ConnectionClosed, PeerUnreachable, ProtocolError
from .frames import Frame, read_frame
from .handshake import offer_hello
from .streams import close_quietly, set_nodelay

log = logging.getLogger("swarm.transport")

OnFrame = Callable[[str, Frame], Awaitable[None]]


class OutgoingConnection:
    def __init__(
        self,
        node_id: str,
        address: tuple[str, int],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_frame: OnFrame | None,
        max_payload: int,
    ) -> None:
        self.node_id = node_id
        self.address = address
        self._writer = writer
        self._lock = asyncio.Lock()  # one frame's pieces at a time
        self._watcher = asyncio.create_task(self._watch(reader, on_frame, max_payload))

    @property
    def closed(self) -> bool:
        return self._writer.is_closing() or self._watcher.done()

    async def send(self, pieces: Sequence[bytes | memoryview]) -> None:
        """Write one encoded frame; ConnectionError/OSError if the socket is gone."""
        async with self._lock:
            if self.closed:
                raise ConnectionResetError("connection already closed")
            self._writer.writelines(pieces)
            await self._writer.drain()

    async def close(self) -> None:
        self._watcher.cancel()
        await close_quietly(self._writer)

    async def _watch(self, reader: asyncio.StreamReader, on_frame: OnFrame | None, max_payload: int) -> None:
        try:
            while True:
                frame = await read_frame(reader, max_payload)
                if on_frame is not None:
                    await on_frame(self.node_id, frame)
        except ConnectionClosed:
            log.debug("peer %s closed our connection", self.node_id)
        except (ProtocolError, OSError) as exc:
            log.warning("connection to %s at %s:%d closed: %s", self.node_id, *self.address, exc)
        except Exception as exc:  # on_frame's bug must not go unnoticed, nor kill others
            log.warning("connection to %s closed: on_message raised %r", self.node_id, exc)
        finally:
            self._writer.close()


async def open_connection(
    own_id: str,
    swarm: str,
    node_id: str,
    address: tuple[str, int],
    *,
    timeout: float,
    on_frame: OnFrame | None,
    max_payload: int,
) -> OutgoingConnection:
    """Connect and handshake within `timeout`; PeerUnreachable otherwise."""
    host, port = address
    writer: asyncio.StreamWriter | None = None

    async def establish() -> OutgoingConnection:
        nonlocal writer
        reader, writer = await asyncio.open_connection(host, port)
        set_nodelay(writer)
        await offer_hello(reader, writer, own_id, swarm, expected_peer=node_id, timeout=timeout)
        return OutgoingConnection(node_id, address, reader, writer, on_frame, max_payload)

    try:
        return await asyncio.wait_for(establish(), timeout)
    except asyncio.TimeoutError:
        reason = f"no connection to {host}:{port} within {timeout} s"
    except (OSError, ProtocolError) as exc:
        reason = f"{host}:{port}: {type(exc).__name__}: {exc}"
    if writer is not None:
        await close_quietly(writer)
    raise PeerUnreachable(node_id, reason)
