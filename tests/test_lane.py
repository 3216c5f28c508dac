"""The data lane (transport/lane.py) over real loopback sockets, each node with its own MLX worker thread.

A node's listener accepts and answers the hello on the event loop, then hands the
connection to the lane on the worker thread; the lane reads and writes every
connection, one per pair of peers whoever opened it. These tests drive that from
the outside, as peers do.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import queue
import socket
import threading
import time

import pytest
from helpers import eventually
from peer_nodes import (HOST, PeerNode, established_to, frame_bytes, hello_bytes, raw_hello_session, token,
                        transport_warnings)

from swarm.transport.errors import PeerUnreachable, ProtocolError
from swarm.transport.frames import FrameParser, encode_frame
from swarm.transport.messages import Forward, decode

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def nodes():
    addresses: dict[str, tuple[str, int]] = {}
    a, b = await PeerNode("node-a", addresses).start(), await PeerNode("node-b", addresses).start()
    yield a, b, addresses
    await a.stop()
    await b.stop()


def test_parser_takes_frames_in_any_pieces_and_rejects_lies() -> None:
    data = b"".join(bytes(p) for h in ({"t": "a"}, {"t": "b", "n": 2}) for p in encode_frame(h, b"xyz" * h.get("n", 1)))
    parser = FrameParser()
    got = [f for i in range(len(data)) for f in parser.feed(data[i:i + 1])]  # a byte at a time
    assert [(f.header["t"], f.payload) for f in got] == [("a", b"xyz"), ("b", b"xyzxyz")]
    with pytest.raises(ProtocolError, match="payload"):
        FrameParser(max_payload=10).feed(frame_bytes({"t": "x"}, b"y" * 11)[:8])
    with pytest.raises(ProtocolError):
        FrameParser().feed(b"\0\0\0\3\0\0\0\0\xc1\xc1\xc1")  # a header msgpack cannot decode


def forward(seq: int, payload: bytes) -> Forward:
    """Hidden states of one float32 value per byte quadruple: any payload a multiple of 4 bytes."""
    return Forward("r1", "p1", seq, 1, "node-a", None, "float32", (1, len(payload) // 4, 1), payload)


async def test_frames_arrive_in_order_and_whole(nodes) -> None:
    a, b, _ = nodes
    big = bytes(range(256)) * (5 * 4096)  # 5 MiB: a long prompt's activations
    for i in range(200):
        await a.send("node-b", forward(i, big if i == 100 else b"%04d" % i))
    got = await b.received_async(200)
    assert [m.pos for _, m in got] == list(range(200))
    assert {sender for sender, _ in got} == {"node-a"}
    assert got[100][1].payload == big and got[7][1].payload == b"0007"


async def test_garbage_closes_only_its_connection(nodes, caplog) -> None:
    a, b, addresses = nodes

    def hostile_peer() -> bytes:  # in a thread: b's listener answers the hello on this event loop
        with raw_hello_session(addresses["node-b"], "node-x") as raw:
            raw.sendall(b"\xff" * 64)  # from here on b's lane reads this connection
            try:
                return raw.recv(4096)
            except ConnectionResetError:
                return b""  # a link that broke is closed with a reset

    assert await asyncio.to_thread(hostile_peer) == b""  # closed by b
    await a.send("node-b", token(1))
    [(_, message)] = await b.received_async(1)
    assert message.at == 2
    assert any("frame header of" in w for w in transport_warnings(caplog)), transport_warnings(caplog)


async def test_send_reconnects_after_the_peer_restarts(nodes) -> None:
    a, b, addresses = nodes
    await a.send("node-b", token(0))
    await b.received_async(1)
    port = addresses["node-b"][1]
    await b.stop()
    b2 = await PeerNode("node-b", addresses, port=port).start()
    try:
        await asyncio.sleep(0.2)  # the old connection's close has reached a
        await a.send("node-b", token(1))
        [(_, message)] = await b2.received_async(1)
        assert message.at == 2
    finally:
        await b2.stop()


def reporting_broken(node: PeerNode) -> queue.Queue:
    """What `node`'s lane reports broken (peer, problem), from now on."""
    broken: queue.Queue = queue.Queue()
    node.lane.serve(lambda sender, message: node.inbox.put((sender, message)),
                    on_broken=lambda peer, why: broken.put((peer, why)))
    return broken


async def test_unreachable_or_unknown_peers_fail_fast() -> None:
    with socket.socket() as s:
        s.bind((HOST, 0))
        dead = s.getsockname()[1]
    a = await PeerNode("node-a", {"node-x": (HOST, dead)}, connect_timeout=0.5).start()
    broken = reporting_broken(a)
    try:
        start = time.monotonic()
        with pytest.raises(PeerUnreachable, match="node-x"):
            await a.send("node-x", token(0))  # (the dial was off the MLX thread: PeerNode.send waits for it)
        peer, why = await asyncio.to_thread(broken.get, True, 5)  # the lane's own report
        assert peer == "node-x" and "could not connect" in why
        with pytest.raises(PeerUnreachable, match="view"):
            await a.send("node-y", token(0))
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
        conn.sendall(hello_bytes("node-s"))
        return conn

    accepted = asyncio.get_running_loop().run_in_executor(None, silent_peer)
    a = await PeerNode("node-a", {"node-s": (HOST, port)}, stall_timeout=0.5).start()
    try:
        start = time.monotonic()
        with pytest.raises(PeerUnreachable, match="node-s"):
            for i in range(1000):  # fills both socket buffers, then blocks
                await a.send("node-s", forward(i, b"\0" * (1 << 20)))
        assert time.monotonic() - start < 10
    finally:
        (await accepted).close()
        server.close()
        await a.stop()


async def test_a_listener_that_never_says_hello_fails_within_the_connect_timeout() -> None:
    with socket.create_server((HOST, 0)) as silent:  # the kernel accepts; nobody answers
        a = await PeerNode("node-a", {"node-s": (HOST, silent.getsockname()[1])}, connect_timeout=0.3).start()
        broken = reporting_broken(a)
        try:
            start = time.monotonic()
            with pytest.raises(PeerUnreachable, match="node-s"):
                await a.send("node-s", token(0))
            assert time.monotonic() - start < 0.3 + 0.5
            assert broken.get(timeout=5)[0] == "node-s"
        finally:
            await a.stop()


def answer_hello_and_read(server: socket.socket, node_id: str, count: int) -> tuple[socket.socket, list]:
    """Accept one connection, answer its hello as `node_id`, and read `count` messages from it (a thread)."""
    conn, _ = server.accept()
    conn.settimeout(30)
    conn.recv(4096)  # the dialer's hello
    conn.sendall(hello_bytes(node_id))
    parser, got = FrameParser(1 << 20), []
    while len(got) < count:
        data = conn.recv(65536)
        assert data, "closed before its frames came"
        got += [decode(frame) for frame in parser.feed(data)]
    return conn, got


async def test_a_link_whose_hello_is_answered_after_the_node_stopped_is_closed_by_it() -> None:
    """A dial runs on a thread of its own: one that ends after the node stopped must close what it opened,
    not leave the peer's connection open until garbage collection."""
    addresses: dict[str, tuple[str, int]] = {}
    with socket.create_server((HOST, 0)) as slow:
        addresses["node-s"] = (HOST, slow.getsockname()[1])
        a = await PeerNode("node-a", addresses, connect_timeout=30.0).start()
        accepted = asyncio.get_running_loop().run_in_executor(None, slow.accept)
        await asyncio.wait_for(a.worker.run(a.lane.mlx_send, "node-s", token(0)), 20)
        conn, _ = await asyncio.wait_for(accepted, 20)
        with conn:
            conn.settimeout(10)
            conn.recv(4096)  # the dialer's hello, while the node stops
            await a.stop()
            gc.disable()  # (the node object and its links stay referenced: only the node may close it)
            try:
                conn.sendall(hello_bytes("node-s"))
                start = time.monotonic()
                data = b"x"
                while data:
                    data = conn.recv(65536)  # raises after 10 s if it stays open
                assert time.monotonic() - start < 5
            finally:
                gc.enable()


async def test_a_peer_slow_to_answer_its_hello_holds_up_no_frames_to_others() -> None:
    """Connecting waits on the peer (a host slow to accept, or to answer the hello: up to the connect
    timeout). The MLX thread carries every other peer's frames meanwhile, and the frames for the slow
    peer follow, in order, once its link is open."""
    addresses: dict[str, tuple[str, int]] = {}
    with socket.create_server((HOST, 0)) as slow:  # the kernel accepts; the hello is answered when we say
        addresses["node-s"] = (HOST, slow.getsockname()[1])
        a = await PeerNode("node-a", addresses, connect_timeout=50.0).start()
        b = await PeerNode("node-b", addresses).start()
        broken = reporting_broken(a)
        try:
            # (before, the first send held the MLX thread until the hello was answered or timed out)
            for i in range(3):  # (the lane's own send: PeerNode.send would wait for the link)
                await asyncio.wait_for(a.worker.run(a.lane.mlx_send, "node-s", token(i)), 20)
            await asyncio.wait_for(a.send("node-b", token(7)), 20)
            [(_, message)] = await b.received_async(1, timeout=20)
            assert message.at == 8
            conn, got = await asyncio.to_thread(answer_hello_and_read, slow, "node-s", 3)
            conn.close()
            assert [m.at for m in got] == [1, 2, 3]
            assert broken.empty()
        finally:
            await a.stop()
            await b.stop()


# -- one connection per pair of peers --------------------------------------------------------
async def test_two_nodes_exchanging_frames_hold_one_connection(nodes) -> None:
    a, b, _ = nodes
    for i in range(20):  # both directions, each side sending first in turn
        sender, receiver = (a, b) if i % 2 else (b, a)
        await sender.send(receiver.node_id, token(i))
        await receiver.received_async(1)
        await receiver.send(sender.node_id, token(i))
        await sender.received_async(1)
    # b sent first, so b dialed; a answered and has used that connection ever since
    assert a.links.snapshot() == {"node-b": "answered"} and b.links.snapshot() == {"node-a": "dialed"}
    assert established_to(a.port, b.port) == 1


async def test_simultaneous_connects_converge_on_one_connection_and_lose_nothing(caplog) -> None:
    """Both nodes dial each other at the same instant, again and again: one connection stays, and every
    message sent meanwhile arrives, in order. When the dials really crossed, the lower id's stays."""
    caplog.set_level(logging.DEBUG, logger="swarm.transport")
    addresses: dict[str, tuple[str, int]] = {}
    crossed = 0
    a, b = await PeerNode("node-a", addresses).start(), await PeerNode("node-b", addresses).start()
    per_round = 30
    try:
        for round_ in range(15):
            both = threading.Barrier(2)

            def burst(node: PeerNode, to: str) -> None:  # on the node's MLX thread: dial at the barrier
                both.wait(5)
                for i in range(per_round):
                    node.lane.mlx_send(to, token(round_ * per_round + i, rid=node.node_id))

            await asyncio.gather(a.worker.run(burst, a, "node-b"), b.worker.run(burst, b, "node-a"))
            got_a, got_b = await a.received_async(per_round), await b.received_async(per_round)
            expected = [round_ * per_round + i + 1 for i in range(per_round)]
            assert [m.at for _, m in got_a] == expected and [m.at for _, m in got_b] == expected
            assert {m.rid for _, m in got_a} == {"node-b"} and {m.rid for _, m in got_b} == {"node-a"}
            deadline = time.monotonic() + 5
            while established_to(a.port, b.port) != 1:  # a refused duplicate closes within moments
                assert time.monotonic() < deadline, f"round {round_}: {established_to(a.port, b.port)} connections"
                await asyncio.sleep(0.01)
            refused = [r for r in caplog.records if "refused a second connection" in r.getMessage()]
            caplog.clear()
            if refused:  # the dials crossed: b's was refused, a's stays
                crossed += 1
                assert a.links.snapshot() == {"node-b": "dialed"} and b.links.snapshot() == {"node-a": "answered"}
            else:  # one dial was through before the other began: that one stays
                assert {*a.links.snapshot().values(), *b.links.snapshot().values()} == {"dialed", "answered"}
            for node, peer in ((a, "node-b"), (b, "node-a")):  # next round: both start without a connection
                await node.worker.run(node.lane.mlx_drop, peer)
            while established_to(a.port, b.port):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
        print(f"dials crossed in {crossed} of 15 rounds")
        assert crossed >= 3, f"the dials crossed in only {crossed} of 15 rounds: the race was not exercised"
    finally:
        await a.stop()
        await b.stop()


async def test_a_second_connection_from_the_same_peer_replaces_the_first_without_losing_frames(nodes) -> None:
    """A peer that dials again (it dropped its connection) gets the new one used; what it sent on the
    old one is still read."""
    a, b, addresses = nodes
    await a.send("node-b", token(0))
    await b.received_async(1)
    old = b.links.link("node-a")

    def redial() -> None:  # on a's MLX thread: one more message on the old connection, then a new one
        a.lane.mlx_send("node-b", token(1))
        conn = a.links.link("node-b")
        a.links.remove(conn)  # as a dropped link: forgotten, but its bytes are on their way
        a.lane.mlx_send("node-b", token(2))  # dials again
        conn.close()

    await a.worker.run(redial)
    got = await b.received_async(2)
    assert [m.at for _, m in got] == [2, 3]
    assert b.links.link("node-a") is not old
    await b.send("node-a", token(3))
    [(_, message)] = await a.received_async(1)
    assert message.at == 4
    await eventually(lambda: established_to(a.port, b.port) == 1, 5, "one connection between them")
