"""Test support: the peer data path of a node without the rest of it, over real loopback sockets.

    node = await PeerNode("node-a", addresses).start()   # listener + links + lane on an MLX worker thread
    await node.send("node-b", Token(...))                 # the lane sends it, on that thread
    sender, message = await node.received_one()           # what its handler got

Each node has its own MlxWorker thread, as in a real node; all share one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import socket

import psutil
import pytest

from swarm.engine.worker import MlxWorker
from discovery.profile import PROTOCOL_VERSION
from swarm.transport.frames import MAGIC, encode_frame
from swarm.transport.lane import DataLane
from swarm.transport.links import PeerLinks
from swarm.transport.listener import PeerListener
from swarm.transport.handshake_messages import Hello
from swarm.transport.messages import Message, Token

HOST = "127.0.0.1"
SWARM = "test-swarm"


class PeerNode:
    def __init__(self, node_id: str, addresses: dict[str, tuple[str, int]], *, swarm: str = SWARM, port: int = 0,
                 profile=None, on_message=None, max_payload: int | None = None, key: bytes | None = None,
                 listener_kwargs: dict | None = None, **lane_kwargs) -> None:
        """`key`: a stretched swarm secret (link_crypto.stretch_secret), for sealed links."""
        self.node_id, self.addresses, self.inbox = node_id, addresses, queue.Queue()
        self.worker = MlxWorker()
        self.links = PeerLinks(node_id)
        sizes = {"max_payload": max_payload} if max_payload else {}
        self.lane = DataLane(node_id, swarm, self.links, self.worker.watch, self.worker.post, addresses.get,
                             key=key, writes=self.worker, **sizes, **lane_kwargs)
        self.listener = PeerListener(node_id, swarm, HOST, port, self.links, self.lane,
                                     (lambda: profile) if profile is not None else None, key=key, **sizes,
                                     **(listener_kwargs or {}))
        self.lane.serve(on_message or (lambda sender, message: self.inbox.put((sender, message))))
        self._stopped = False

    async def start(self) -> "PeerNode":
        await self.listener.start()
        self.addresses[self.node_id] = (HOST, self.listener.port)
        return self

    @property
    def port(self) -> int:
        return self.listener.port

    async def send(self, node_id: str, message: Message) -> None:
        """Sent, or on its way once its link is open: PeerUnreachable if that fails (the lane reports it
        to on_broken too, and its MLX thread never waits on a dial)."""
        # awaited, not run_sync: the receiving listener shares this event loop
        opening = await self.worker.run(self._mlx_send, node_id, message)
        if opening is not None:
            await asyncio.wrap_future(opening)

    def _mlx_send(self, node_id: str, message: Message):
        self.lane.mlx_send(node_id, message)
        return self.lane.mlx_opening(node_id)

    def received(self, count: int, timeout: float = 5.0) -> list[tuple[str, Message]]:
        return [self.inbox.get(timeout=timeout) for _ in range(count)]

    async def received_async(self, count: int, timeout: float = 5.0) -> list[tuple[str, Message]]:
        return await asyncio.to_thread(self.received, count, timeout)

    def nothing_received(self) -> bool:
        return self.inbox.empty()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.worker.run(self.lane.mlx_close)
        await self.listener.stop()
        self.worker.close()


def token(seq: int, rid: str = "r1", plan: str = "p1") -> Token:
    """A small valid message whose `at` numbers it."""
    return Token(rid, plan, seq + 1, seq % 1000, 0)


def hello_bytes(node_id: str, swarm: str = SWARM, **fields) -> bytes:
    return frame_bytes(*Hello(PROTOCOL_VERSION, node_id, swarm, **fields).to_frame())


def frame_bytes(header: dict, payload: bytes = b"") -> bytes:
    return b"".join(bytes(piece) for piece in encode_frame(header, payload))


def established_to(*ports: int) -> int:
    """Established TCP connections with one end on one of these listening ports (each counted once,
    though this process holds both ends): with only two nodes about, the connections between them."""
    ends = {frozenset({(c.laddr.ip, c.laddr.port), (c.raddr.ip, c.raddr.port)})
            for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.raddr and {c.laddr.port, c.raddr.port} & set(ports)}
    return len(ends)


def transport_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "swarm.transport" and r.levelno >= logging.WARNING]


def raw_hello_session(address: tuple[str, int], node_id: str = "raw-client") -> socket.socket:
    """A blocking socket that said hello like a node and read the answer (call in a thread)."""
    raw = socket.create_connection(address, timeout=5)
    raw.sendall(MAGIC + hello_bytes(node_id))
    answer = raw.recv(4096)
    assert Hello.T.encode() in answer, answer
    return raw


__all__ = ["HOST", "SWARM", "PeerNode", "token", "hello_bytes", "frame_bytes", "established_to",
           "transport_warnings", "raw_hello_session", "MAGIC"]
