"""The TCP transport: the node's peer port plus its outgoing connections.

The peer port is shared with discovery, so every accepted connection is
routed by its first 4 bytes:
    b"SWRM"  -> hello, then frames delivered to on_message (or, with `adopt`,
                the connection handed over to the data lane: see lane.py)
    b"SWPF"  -> discovery's profile answer
    nothing  -> a liveness probe (connect + close): closed quietly
    other    -> one warning line, closed
Direction: a node reads frames on connections it accepted and writes on its
own outgoing ones; a reply opens/uses the replier's outgoing connection.
Whatever arrives on an outgoing connection still reaches on_message.
A bad connection is closed with one log line; nobody else notices.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, Callable

from discovery.profile_exchange import MAGIC as PROFILE_MAGIC
from discovery.profile_exchange import answer_profile_request

from ..hop_trace import mark
from .base import Address, OnMessage, Transport
from .errors import ConnectionClosed, PeerUnreachable, ProtocolError
from .frames import DEFAULT_MAX_PAYLOAD_BYTES, MAGIC, encode_frame, read_frame, read_magic
from .handshake import HANDSHAKE_TIMEOUT, accept_hello, raise_if_rejected
from .outgoing import OutgoingConnection, open_connection
from .streams import close_quietly, set_nodelay

log = logging.getLogger("swarm.transport")

DEFAULT_CONNECT_TIMEOUT = 2.0

# (socket, sender node id, "host:port", bytes already read past the hello)
Adopt = Callable[[socket.socket, str, str, bytes], None]


class TcpTransport(Transport):
    def __init__(
        self,
        node_id: str,
        swarm: str,
        host: str,
        port: int,
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
        profile_provider: Callable[[], Any] | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        adopt: Adopt | None = None,
    ) -> None:
        self.node_id = node_id
        self.swarm = swarm
        self.host = host
        self.port = port  # the bound port once started (port=0 picks one)
        self.max_payload = max_payload
        self.connect_timeout = connect_timeout
        self.handshake_timeout = handshake_timeout
        self._profile_provider = profile_provider
        self._adopt = adopt
        self._on_message: OnMessage | None = None
        self._server: asyncio.Server | None = None
        self._incoming: set[asyncio.Task] = set()
        self._outgoing: dict[str, OutgoingConnection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}

    # -- lifecycle --------------------------------------------------------
    async def start(self, on_message: OnMessage) -> None:
        self._on_message = on_message
        # The StreamReader's default 64 KiB limit only sets when reading pauses;
        # 1-16 MiB measured no faster for 4.7 MB frames (benchmarks/transport_roundtrip.py).
        self._server = await asyncio.start_server(self._serve_connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        # Cancel connections before wait_closed: from 3.12 on it waits for them.
        for task in list(self._incoming):
            task.cancel()
        await asyncio.gather(*self._incoming, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        for node_id in list(self._outgoing):
            await self.drop(node_id)

    # -- sending ----------------------------------------------------------
    async def send(self, node_id: str, address: Address, header: dict, payload: bytes | memoryview = b"") -> None:
        pieces = encode_frame(header, payload)  # a bad header is the caller's bug: ValueError
        connection = await self._connection(node_id, tuple(address))
        try:
            await connection.send(pieces)
        except (ConnectionError, OSError) as exc:
            await self._forget(node_id, connection)
            raise PeerUnreachable(node_id, f"connection broke: {type(exc).__name__}: {exc}") from exc

    async def drop(self, node_id: str) -> None:
        connection = self._outgoing.pop(node_id, None)
        if connection is not None:
            await connection.close()

    async def _connection(self, node_id: str, address: Address) -> OutgoingConnection:
        # One lock per peer: concurrent first sends open one connection, not several.
        async with self._connecting.setdefault(node_id, asyncio.Lock()):
            connection = self._outgoing.get(node_id)
            if connection is not None and not connection.closed and connection.address == address:
                return connection
            if connection is not None:  # closed by the peer, or the node moved
                await self._forget(node_id, connection)
            connection = await open_connection(
                self.node_id,
                self.swarm,
                node_id,
                address,
                timeout=self.connect_timeout,
                on_frame=self._on_message,
                max_payload=self.max_payload,
            )
            self._outgoing[node_id] = connection
            return connection

    async def _forget(self, node_id: str, connection: OutgoingConnection) -> None:
        if self._outgoing.get(node_id) is connection:
            del self._outgoing[node_id]
        await connection.close()

    # -- receiving --------------------------------------------------------
    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._incoming.add(task)
        peer = writer.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if peer else "?"
        set_nodelay(writer)
        try:
            await self._route(reader, writer, where)
        except ConnectionClosed:
            log.debug("%s closed its connection", where)
        except asyncio.TimeoutError:  # before OSError: it is one since 3.11
            log.warning("closing peer connection from %s: nothing sent within %s s", where, self.handshake_timeout)
        except (ProtocolError, OSError) as exc:
            log.warning("closing peer connection from %s: %s", where, exc)
        except asyncio.CancelledError:
            pass  # stop(): the server is going away
        except Exception as exc:  # on_message's bug: close this connection, keep serving
            log.warning("closing peer connection from %s: %r", where, exc)
        finally:
            self._incoming.discard(task)
            await close_quietly(writer)

    async def _route(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str) -> None:
        magic = await asyncio.wait_for(read_magic(reader), self.handshake_timeout)
        if magic == MAGIC:
            await self._receive_frames(reader, writer, where)
        elif magic == PROFILE_MAGIC:
            if self._profile_provider is None:
                raise ProtocolError("profile request, but this node serves no profile")
            await answer_profile_request(reader, writer, self._profile_provider())
        elif magic == b"":
            log.debug("liveness probe from %s", where)
        else:
            raise ProtocolError(f"unknown magic {magic!r}")

    async def _receive_frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str) -> None:
        sender = await accept_hello(reader, writer, self.node_id, self.swarm, self.handshake_timeout)
        log.debug("peer %s connected from %s", sender, where)
        if self._adopt is not None:
            self._hand_over(reader, writer, sender, where)
            return
        frame = await read_frame(reader, self.max_payload)
        raise_if_rejected(frame)
        while True:
            if self._on_message is not None:
                mark("received", frame.header)
                await self._on_message(sender, frame)
            frame = await read_frame(reader, self.max_payload)

    def _hand_over(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sender: str, where: str) -> None:
        """Give a handshaken connection to `adopt`; closing ours afterwards leaves its duplicate open."""
        writer.transport.pause_reading()
        # A peer sends its first frame only after our hello, so this is nearly always empty;
        # asyncio has no public accessor for what its reader already holds.
        pending = bytes(reader._buffer)
        self._adopt(writer.get_extra_info("socket").dup(), sender, where, pending)
