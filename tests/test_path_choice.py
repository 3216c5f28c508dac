"""A peer with several addresses over real loopback sockets: the lane dials the next when one does not
answer, the path choice drops an address that does not answer and moves the link off it, and the frame
hold holds frames by address (node/path_choice.py, transport/lane.py, transport/frame_hold.py)."""

from __future__ import annotations

import asyncio
import queue
import socket
from types import SimpleNamespace

import pytest
from helpers import eventually
from peer_nodes import HOST, SWARM, PeerNode, token

from swarm.node.path_choice import PATH_PURPOSE, PathChoice, serve_paths
from swarm.transport.frame_hold import FrameHold
from swarm.transport.link_handshake import LinkAuth

pytestmark = pytest.mark.timeout(60)
DEAD = "127.0.0.3"  # nothing listens there: the nodes' listeners are on 127.0.0.1 only


def refused_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]  # closed again: a connect there is refused


async def test_a_dial_falls_back_to_the_next_address() -> None:
    addresses: dict = {}
    dead = (HOST, refused_port())
    a = await PeerNode("node-a", addresses, endpoints_of=lambda peer: [dead, addresses[peer]]).start()
    b = await PeerNode("node-b", addresses).start()
    try:
        await a.send("node-b", token(1))
        [(sender, _)] = await b.received_async(1)
        assert sender == "node-a"
        assert a.links.link("node-b").where == f"{HOST}:{b.port}"
    finally:
        await a.stop()
        await b.stop()


async def test_the_path_choice_drops_an_address_that_does_not_answer_and_breaks_the_link_on_it() -> None:
    addresses: dict = {}
    b = await PeerNode("node-b", addresses).start()
    b.listener.serve_purpose(PATH_PURPOSE, serve_paths(None))
    told: queue.Queue = queue.Queue()
    a = await PeerNode("node-a", addresses).start()
    peer_b = SimpleNamespace(node_id="node-b", addresses=(DEAD, HOST), profile=SimpleNamespace(peer_port=b.port))
    paths = PathChoice(lambda: [peer_b], LinkAuth("node-a", SWARM, None), a.links,
                       lambda *told_lane: told.put(told_lane))
    await paths.start()
    try:
        assert paths.endpoints_of("node-b", (DEAD, b.port)) == [(DEAD, b.port)]  # discovery's, until measured
        await eventually(lambda: paths.endpoints_of("node-b", (DEAD, b.port))[0] == (HOST, b.port), 20,
                         "the answering address first")
        snap = paths.snapshot()["node-b"]
        assert snap["chosen"] == HOST and HOST in snap["rtt_ms"] and DEAD not in snap["rtt_ms"]
        assert told.get(timeout=5) == ("node-b", DEAD, f"its address {DEAD} stopped answering")

        # The lane, told an address stopped answering, breaks a link on it (and only on it).
        broken: queue.Queue = queue.Queue()
        a.lane.serve(lambda *_: None, on_broken=lambda peer, why: broken.put((peer, why)))
        await a.send("node-b", token(1))
        await b.received_async(1)
        await a.worker.run(a.lane.mlx_path_failed, "node-b", DEAD, "stopped answering")
        assert a.links.link("node-b") is not None and broken.empty()
        await a.worker.run(a.lane.mlx_path_failed, "node-b", HOST, "stopped answering")
        assert await asyncio.to_thread(broken.get, True, 5) == ("node-b", "stopped answering")
        assert a.links.link("node-b") is None
    finally:
        await paths.stop()
        await a.stop()
        await b.stop()


async def test_a_faster_address_takes_over_an_idle_link_we_dialed() -> None:
    addresses: dict = {}
    a, b = await PeerNode("node-a", addresses).start(), await PeerNode("node-b", addresses).start()
    try:
        await a.send("node-b", token(1))
        await b.received_async(1)
        conn = a.links.link("node-b")
        await a.worker.run(a.lane.mlx_path_faster, "node-b", HOST)  # already there: stays
        assert a.links.link("node-b") is conn
        await moved_once_idle(a, conn)
        await a.send("node-b", token(2))  # dials again (at the chosen address)
        [(_, got)] = await b.received_async(1)
        assert got.at == token(2).at and a.links.link("node-b") is not conn
    finally:
        await a.stop()
        await b.stop()


async def moved_once_idle(node: PeerNode, conn) -> None:
    """Tell the lane another address is faster until it retires `conn` (it waits for the link to idle)."""
    for _ in range(200):
        await node.worker.run(node.lane.mlx_path_faster, "node-b", DEAD)
        if node.links.link("node-b") is not conn:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the idle link never moved")


def test_the_frame_hold_holds_by_address_before_peer() -> None:
    hold = FrameHold.from_environment({"SWARM_HOLD_FRAMES": "10.0.0.2:20,node-b:5"})
    assert hold.delay_for("node-b", "10.0.0.2") == pytest.approx(0.020)
    assert hold.delay_for("node-b", "10.0.1.2") == pytest.approx(0.005)
    assert hold.delay_for("node-c", "10.0.1.2") == 0.0
    assert hold.delay_to_address("10.0.0.2") == pytest.approx(0.020)
    assert hold.delay_to_address("10.0.1.2") == 0.0
    assert FrameHold({"*": 0.03}).delay_to_address("10.0.1.2") == pytest.approx(0.03)
