"""A peer that reads slowly or not at all, on the data lane (transport/lane.py, connection.py), over real
loopback sockets: sends to it never hold the MLX thread, its link breaks once it takes no bytes for the
stall timeout or falls too far behind, and planning is told (`on_stalled`). The silent peer says hello
like a node and then reads nothing: its kernel buffers fill, then our queue."""

from __future__ import annotations

import asyncio
import queue
import socket

import pytest
from peer_nodes import HOST, PeerNode, hello_bytes

from swarm.transport.errors import PeerUnreachable
from swarm.transport.messages import Forward

pytestmark = pytest.mark.timeout(60)
MIB = 1 << 20


def forward(seq: int, payload: bytes, rid: str = "r1") -> Forward:
    return Forward(rid, "p1", seq, 1, "node-a", None, "float32", (1, len(payload) // 4, 1), payload)


class SilentPeer:
    """A listener that answers one hello as `node-s` and then never reads again."""

    def __init__(self) -> None:
        self.server = socket.create_server((HOST, 0))
        self.port = self.server.getsockname()[1]
        self.conn: socket.socket | None = None

    def accept(self) -> None:
        self.conn, _ = self.server.accept()
        self.conn.recv(4096)
        self.conn.sendall(hello_bytes("node-s"))

    def close(self) -> None:
        for s in (self.conn, self.server):
            if s is not None:
                s.close()


async def with_silent_peer(addresses: dict, **lane_kwargs):
    silent = SilentPeer()
    addresses["node-s"] = (HOST, silent.port)
    accepted = asyncio.get_running_loop().run_in_executor(None, silent.accept)
    a = await PeerNode("node-a", addresses, **lane_kwargs).start()
    stalled, broken = queue.Queue(), queue.Queue()
    a.lane.serve(lambda sender, m: a.inbox.put((sender, m)), on_broken=lambda p, why: broken.put((p, why)),
                 on_stalled=lambda p, why: stalled.put((p, why)))
    return a, silent, accepted, stalled, broken


async def test_sends_to_a_peer_that_reads_nothing_do_not_hold_up_frames_to_others() -> None:
    addresses: dict[str, tuple[str, int]] = {}
    a, silent, accepted, stalled, _ = await with_silent_peer(addresses, stall_timeout=30.0)
    b = await PeerNode("node-b", addresses).start()
    try:
        # 24 MiB for a peer that reads nothing: far more than the kernel's buffers take. Each send returns
        # (the rest waits in the link's queue); before, the first that found no room waited out the timeout.
        for i in range(24):
            await asyncio.wait_for(a.send("node-s", forward(i, b"\1" * MIB)), 10)
        await accepted
        assert a.lane.links.link("node-s").queued > 0
        for i in range(5):
            await asyncio.wait_for(a.send("node-b", forward(i, b"%04d" % i)), 10)
        got = await b.received_async(5)
        assert [m.pos for _, m in got] == list(range(5))
        assert stalled.empty()
    finally:
        silent.close()
        await a.stop()
        await b.stop()


async def test_a_link_that_takes_no_bytes_for_the_stall_timeout_breaks_and_planning_hears() -> None:
    a, silent, accepted, stalled, broken = await with_silent_peer({}, stall_timeout=0.5)
    try:
        for i in range(24):
            await a.send("node-s", forward(i, b"\1" * MIB))
        await accepted
        peer, why = await asyncio.to_thread(stalled.get, True, 20)  # nobody sends any more: the timer sees it
        assert peer == "node-s" and "took no data" in why
        assert broken.get(timeout=5)[0] == "node-s"  # (the entries replay what they sent on it)
        assert a.lane.links.link("node-s") is None
    finally:
        silent.close()
        await a.stop()


async def test_a_peer_that_falls_a_queue_behind_breaks_its_link_at_once() -> None:
    a, silent, accepted, stalled, _ = await with_silent_peer({}, stall_timeout=30.0, queue_limit=4 * MIB)
    try:
        with pytest.raises(PeerUnreachable, match="does not keep up"):
            for i in range(64):
                await a.send("node-s", forward(i, b"\1" * MIB))
        await accepted
        peer, why = stalled.get(timeout=5)
        assert peer == "node-s" and "does not keep up" in why
    finally:
        silent.close()
        await a.stop()


async def test_frames_that_waited_in_the_queue_arrive_whole_and_in_order() -> None:
    addresses: dict[str, tuple[str, int]] = {}
    a, b = await PeerNode("node-a", addresses).start(), await PeerNode("node-b", addresses).start()
    try:
        # 8 MiB frames, sent back to back: the socket takes a part of each, the queue the rest,
        # and small frames behind them must not overtake them.
        payloads = [bytes([i]) * (8 * MIB) if i % 3 == 0 else b"%04d" % i for i in range(24)]
        for i, payload in enumerate(payloads):
            await a.send("node-b", forward(i, payload))
        got = await b.received_async(len(payloads), timeout=30)
        assert [m.pos for _, m in got] == list(range(len(payloads)))
        assert all(bytes(m.payload) == payloads[m.pos] for _, m in got)
        assert a.lane.links.link("node-b").queued == 0
    finally:
        await a.stop()
        await b.stop()
