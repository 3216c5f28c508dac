"""The frame-hold switch (transport/frame_hold.py): frames to the named peers really wait, in order,
over a real lane on loopback; other peers' frames do not; a malformed setting is refused by name."""

from __future__ import annotations

import time

import pytest
from peer_nodes import PeerNode

from swarm.transport.frame_hold import FrameHold
from swarm.transport.messages import Forward
from swarm.transport.ping_messages import Pong

pytestmark = pytest.mark.timeout(60)
HOLD_S = 0.2


def forward(seq: int) -> Forward:
    return Forward("r1", "p1", seq, 1, "node-a", None, "float32", (1, 1, 1), b"%04d" % seq)


async def test_frames_to_a_held_peer_wait_and_keep_their_order() -> None:
    addresses: dict = {}
    a = await PeerNode("node-a", addresses, hold=FrameHold({"node-b": HOLD_S})).start()
    b, c = await PeerNode("node-b", addresses).start(), await PeerNode("node-c", addresses).start()
    try:
        await a.send("node-c", forward(0))  # links open first: what follows times the hold alone
        await a.send("node-b", forward(0))
        await b.received_async(1)
        await c.received_async(1)
        t0 = time.monotonic()
        for i in range(1, 21):
            await a.send("node-b", forward(i))
        await a.send("node-c", forward(1))
        [(_, to_c)] = await c.received_async(1)
        c_took = time.monotonic() - t0
        got = await b.received_async(20)
        b_took = time.monotonic() - t0
        assert [m.pos for _, m in got] == list(range(1, 21))
        assert b_took >= HOLD_S  # really held, not just measured as held
        assert c_took < b_took  # another peer's frame went on meanwhile
    finally:
        for node in (a, b, c):
            await node.stop()


async def test_a_pong_kept_past_its_time_by_work_says_it_waited() -> None:
    """Held frames leave from the MLX thread: one due during a pass leaves after it, which a real link
    would not have done, so a Pong that did says its ping may have waited (node/link_meter.py)."""
    addresses: dict = {}
    a = await PeerNode("node-a", addresses, hold=FrameHold({"node-b": HOLD_S})).start()
    b = await PeerNode("node-b", addresses).start()
    try:
        await a.send("node-b", Pong(0, 5000))  # (one that waits for its link to open says so too)
        [(_, dialed)] = await b.received_async(1, timeout=30)
        on_time = []
        for nonce in range(1, 6):  # (on a loaded machine one may be kept by this thread's preemption)
            await a.send("node-b", Pong(nonce, 5000))
            on_time += [m for _, m in await b.received_async(1, timeout=30) if m.quiet_us]
        await a.send("node-b", Pong(9, 5000))
        a.worker.post(time.sleep, HOLD_S * 2)  # a pass under way when the Pong is due
        [(_, late)] = await b.received_async(1, timeout=30)
        assert dialed == Pong(0, 0) and on_time and late == Pong(9, 0)
    finally:
        for node in (a, b):
            await node.stop()


def test_the_setting_is_read_from_the_environment_and_checked():
    assert FrameHold.from_environment({}) is None
    hold = FrameHold.from_environment({"SWARM_HOLD_FRAMES": "abc:30, *:5"})
    assert hold.delay_for("abc") == pytest.approx(0.03) and hold.delay_for("other") == pytest.approx(0.005)
    assert FrameHold.from_environment({"SWARM_HOLD_FRAMES": "node:1:7"}).delay_for("node:1") == pytest.approx(0.007)
    for bad in ("abc", "abc:x", ":30", "abc:-1", "abc:99999999"):
        with pytest.raises(ValueError, match="SWARM_HOLD_FRAMES"):
            FrameHold.from_environment({"SWARM_HOLD_FRAMES": bad})
