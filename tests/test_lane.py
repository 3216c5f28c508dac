"""The data lane (transport/lane.py) over real loopback sockets, each node with its own MLX worker thread.

A node's TCP transport accepts and handshakes on the event loop, then hands the
connection to the lane on the worker thread; the lane sends on connections of
its own. These tests drive that from the outside, as peers do.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import socket
import time

import pytest

from swarm.engine.worker import MlxWorker
from swarm.transport import MAGIC, Frame, PeerUnreachable, TcpTransport, encode_frame
from swarm.transport.errors import ProtocolError
from swarm.transport.handshake import hello_header
from swarm.transport.lane import DataLane, FrameParser

pytestmark = pytest.mark.timeout(60)

HOST = "127.0.0.1"
SWARM = "lane-swarm"


class LaneNode:
    """A transport that adopts its frame connections into a lane on a worker thread."""

    def __init__(self, node_id: str, addresses: dict[str, tuple[str, int]], **lane_kwargs) -> None:
        self.node_id, self.worker, self.inbox = node_id, MlxWorker(), queue.Queue()
        self.lane = DataLane(node_id, SWARM, self.worker.watch, lambda sender, f: self.inbox.put((sender, f)),
                             addresses.get, **lane_kwargs)
        self.transport = TcpTransport(node_id, SWARM, HOST, 0, adopt=self._adopt)

    def _adopt(self, sock: socket.socket, peer: str, where: str, pending: bytes) -> None:
        self.worker.post(self.lane.adopt, sock, peer, where, pending)

    async def start(self) -> "LaneNode":
        await self.transport.start(self._not_for_lane)
        return self

    async def _not_for_lane(self, sender: str, frame: Frame) -> None:
        raise AssertionError(f"frame from {sender} delivered on the event loop: {frame.header}")

    async def send(self, node_id: str, header: dict, payload: bytes = b"") -> None:
        # awaited, not run_sync: the receiving transport shares this event loop
        await self.worker.run(self.lane.send, node_id, header, payload)

    def received(self, count: int, timeout: float = 5.0) -> list[tuple[str, Frame]]:
        return [self.inbox.get(timeout=timeout) for _ in range(count)]

    async def stop(self) -> None:
        if self.worker.closed:
            return
        await self.worker.run(self.lane.close)
        await self.transport.stop()
        self.worker.close()


@pytest.fixture
async def nodes():
    addresses: dict[str, tuple[str, int]] = {}
    a, b = await LaneNode("node-a", addresses).start(), await LaneNode("node-b", addresses).start()
    addresses.update({"node-a": (HOST, a.transport.port), "node-b": (HOST, b.transport.port)})
    yield a, b, addresses
    await a.stop()
    await b.stop()


def lane_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "swarm.transport" and r.levelno >= logging.WARNING]


def test_parser_takes_frames_in_any_pieces_and_rejects_lies() -> None:
    data = b"".join(bytes(p) for h in ({"t": "a"}, {"t": "b", "n": 2}) for p in encode_frame(h, b"xyz" * h.get("n", 1)))
    parser = FrameParser()
    got = [f for i in range(len(data)) for f in parser.feed(data[i:i + 1])]  # a byte at a time
    assert [(f.header["t"], f.payload) for f in got] == [("a", b"xyz"), ("b", b"xyzxyz")]
    with pytest.raises(ProtocolError, match="payload"):
        FrameParser(max_payload=10).feed(b"".join(bytes(p) for p in encode_frame({"t": "x"}, b"y" * 11))[:8])
    with pytest.raises(ProtocolError):
        FrameParser().feed(b"\0\0\0\3\0\0\0\0\xc1\xc1\xc1")  # a header msgpack cannot decode


async def test_frames_arrive_in_order_and_whole(nodes) -> None:
    a, b, _ = nodes
    big = bytes(range(256)) * (5 * 4096)  # 5 MiB: a long prompt's activations
    for i in range(200):
        await a.send("node-b", {"t": "fwd", "seq": i}, big if i == 100 else b"%d" % i)
    got = await asyncio.to_thread(b.received, 200)
    assert [f.header["seq"] for _, f in got] == list(range(200))
    assert {sender for sender, _ in got} == {"node-a"}
    assert got[100][1].payload == big and got[7][1].payload == b"7"


async def test_garbage_closes_only_its_connection(nodes, caplog) -> None:
    a, b, addresses = nodes

    def hostile_peer() -> bytes:  # in a thread: b's transport answers the hello on this event loop
        with socket.create_connection(addresses["node-b"]) as raw:
            raw.settimeout(5)
            raw.sendall(MAGIC + b"".join(bytes(p) for p in encode_frame(hello_header("node-x", SWARM))))
            raw.recv(4096)  # b's hello: from here on b's lane reads this connection
            raw.sendall(b"\xff" * 64)
            return raw.recv(4096)

    assert await asyncio.to_thread(hostile_peer) == b""  # closed by b
    await a.send("node-b", {"t": "fwd", "seq": 1})
    [(_, frame)] = await asyncio.to_thread(b.received, 1)
    assert frame.header["seq"] == 1
    assert any("frame header of" in w for w in lane_warnings(caplog)), lane_warnings(caplog)


async def test_send_reconnects_after_the_peer_restarts(nodes) -> None:
    a, b, addresses = nodes
    await a.send("node-b", {"t": "fwd", "seq": 0})
    await asyncio.to_thread(b.received, 1)
    port = addresses["node-b"][1]
    await b.stop()
    b2 = LaneNode("node-b", addresses)
    b2.transport.port = port
    await b2.start()
    try:
        await asyncio.sleep(0.2)  # the old connection's close has reached a
        await a.send("node-b", {"t": "fwd", "seq": 1})
        [(_, frame)] = await asyncio.to_thread(b2.received, 1)
        assert frame.header["seq"] == 1
    finally:
        await b2.stop()


async def test_unreachable_or_unknown_peers_fail_fast() -> None:
    with socket.socket() as s:
        s.bind((HOST, 0))
        dead = s.getsockname()[1]
    a = await LaneNode("node-a", {"node-x": (HOST, dead)}, connect_timeout=0.5).start()
    try:
        start = time.monotonic()
        with pytest.raises(PeerUnreachable, match="node-x"):
            await a.send("node-x", {"t": "fwd"})
        with pytest.raises(PeerUnreachable, match="view"):
            await a.send("node-y", {"t": "fwd"})
        assert time.monotonic() - start < 1.5
    finally:
        await a.stop()


async def test_a_peer_that_stops_reading_fails_the_send_in_time() -> None:
    # Says hello like a node, then never reads: the sender must give up after its send timeout.
    server = socket.create_server((HOST, 0))
    port = server.getsockname()[1]

    def silent_peer() -> socket.socket:
        conn, _ = server.accept()
        conn.recv(4096)
        conn.sendall(b"".join(bytes(p) for p in encode_frame(hello_header("node-s", SWARM))))
        return conn

    accepted = asyncio.get_running_loop().run_in_executor(None, silent_peer)
    a = await LaneNode("node-a", {"node-s": (HOST, port)}, send_timeout=0.5).start()
    try:
        start = time.monotonic()
        with pytest.raises(PeerUnreachable, match="node-s"):
            for _ in range(1000):  # fills both socket buffers, then blocks
                await a.send("node-s", {"t": "fwd"}, b"\0" * (1 << 20))
        assert time.monotonic() - start < 10
    finally:
        (await accepted).close()
        server.close()
        await a.stop()


async def test_a_listener_that_never_says_hello_fails_within_the_connect_timeout() -> None:
    with socket.create_server((HOST, 0)) as silent:  # the kernel accepts; nobody answers
        a = await LaneNode("node-a", {"node-s": (HOST, silent.getsockname()[1])}, connect_timeout=0.3).start()
        try:
            start = time.monotonic()
            with pytest.raises(PeerUnreachable, match="node-s"):
                await a.send("node-s", {"t": "fwd"})
            assert time.monotonic() - start < 0.3 + 0.5
        finally:
            await a.stop()
