"""The peer port, on the event loop: accept, route by the first bytes, answer.

The port is shared with discovery, so every accepted connection is routed by its
first 4 bytes:
    b"SWRM"  -> a frame connection: the hello answered (handshake.answer) and, if
                links.py keeps it, the connection handed to the data lane, which
                reads and writes it from then on (on the MLX thread)
    b"SWPF"  -> discovery's profile answer (and liveness: discovery/liveness.py)
    b"SWWT"  -> a weights link (weights/transfer.py), handed to `on_weights`
    nothing  -> a bare connect-and-close: closed quietly
    other    -> one warning line, closed
Profile answers and liveness stay here, on short connections of their own: they
must not wait for the MLX thread, or a long prefill would make this node look dead.
A bad connection is closed with one log line; nobody else notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable

from discovery.profile import NodeProfile
from discovery.profile_exchange import MAGIC as PROFILE_MAGIC
from discovery.profile_exchange import answer_profile_request

from .errors import ConnectionClosed, HandshakeRejected, ProtocolError
from .frames import DEFAULT_MAX_PAYLOAD_BYTES, MAGIC, read_magic
from .handshake import HANDSHAKE_TIMEOUT, answer
from .lane import DataLane
from .links import PeerLinks
from .stream_link import WEIGHTS_MAGIC, StreamFrameLink

log = logging.getLogger("swarm.transport")


class PeerListener:
    def __init__(self, node_id: str, swarm: str, host: str, port: int, links: PeerLinks, lane: DataLane,
                 profile: Callable[[], NodeProfile], *, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 on_weights: Callable[[StreamFrameLink], Awaitable[None]] | None = None) -> None:
        self.node_id, self.swarm, self.host = node_id, swarm, host
        self.port = port  # the bound port once started (port=0 picks one)
        self.links, self.lane, self.profile = links, lane, profile
        self.max_payload, self.handshake_timeout = max_payload, handshake_timeout
        self.on_weights = on_weights
        self._server: asyncio.Server | None = None
        self._serving: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve_connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._serving):  # before wait_closed: from 3.12 on it waits for them
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._serving.add(task)
        peer = writer.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if peer else "?"
        try:
            await self._route(reader, writer, where)
        except ConnectionClosed:
            log.debug("%s closed its connection", where)
        except HandshakeRejected as exc:
            if exc.kind != "duplicate":
                log.warning("closing peer connection from %s: %s", where, exc)
            log.debug("refused a second connection from %s: %s", where, exc.message)
        except asyncio.TimeoutError:  # before OSError: it is one since 3.11
            log.warning("closing peer connection from %s: nothing sent within %s s", where, self.handshake_timeout)
        except (ProtocolError, OSError) as exc:
            log.warning("closing peer connection from %s: %s", where, exc)
        except asyncio.CancelledError:
            pass  # stop(): the server is going away
        finally:
            self._serving.discard(task)
            writer.close()  # a frame connection lives on in the lane's duplicate of the socket
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _route(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str) -> None:
        magic = await asyncio.wait_for(read_magic(reader), self.handshake_timeout)
        if magic == MAGIC:
            conn = await answer(reader, writer, self.node_id, self.swarm, self.links, where, self.max_payload,
                                self.handshake_timeout)
            log.debug("peer %s connected from %s", conn.peer, where)
            self.lane.take_over(conn, self.links.arrived(conn))
        elif magic == PROFILE_MAGIC:
            await answer_profile_request(reader, writer, self.profile())
        elif magic == WEIGHTS_MAGIC and self.on_weights is not None:
            await self.on_weights(StreamFrameLink(where, reader, writer))
        elif magic == b"":
            log.debug("liveness probe from %s", where)
        else:
            raise ProtocolError(f"unknown magic {magic!r}")
