"""Probes over the data lane with real peers over loopback (node/lane_probe.py, node/mlx_rounds.py): a peer
that does not answer a probe is asked for its MLX thread's longest recent round of work. One that turned its
rounds over quickly all along is given up on a grace after the probe's first wait, not after the whole
allowance for the longest pass it may compute; one at a long round (a pass) gets the whole allowance and
answers within it; one that does not say gets the whole allowance."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from peer_nodes import PeerNode

from swarm.engine.worker import MlxWorker
from swarm.node import lane_probe
from swarm.node.lane_probe import LaneProbe
from swarm.node.mlx_rounds import ROUND_MAX_PAYLOAD, ROUND_PURPOSE, ask_round, serve_round
from swarm.transport.handshake import dial_stream
from swarm.transport.probe_messages import Probe, Probed

pytestmark = pytest.mark.timeout(60)

FIRST_WAIT_S, GRACE_S, LONG_ROUND_S = 0.5, 0.3, 0.2


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(lane_probe, "PROBE_TIMEOUT_S", FIRST_WAIT_S)
    monkeypatch.setattr(lane_probe, "TURNOVER_GRACE_S", GRACE_S)
    monkeypatch.setattr(lane_probe, "LONG_ROUND_S", LONG_ROUND_S)


async def prober_and_peer(answers: bool, tells_rounds: bool = True):
    """(a's LaneProbe, a, b): b answers probes if `answers`, and serves the "round" purpose if `tells_rounds`."""
    addresses: dict = {}
    holder: dict = {}

    def on_a(sender, message):
        if isinstance(message, Probed):
            holder["probe"].mlx_answered(sender, message.nonce)

    def on_b(sender, message):
        if isinstance(message, Probe) and answers:
            b.lane.mlx_send(sender, Probed(message.nonce))

    a = await PeerNode("a", addresses, on_message=on_a).start()
    b = await PeerNode("b", addresses, on_message=on_b).start()
    if tells_rounds:
        b.listener.serve_purpose(ROUND_PURPOSE, serve_round(b.worker))

    async def ask(node: str, timeout: float) -> float | None:
        return await ask_round(lambda: dial_stream(addresses[node], a.lane.auth, ROUND_PURPOSE, expected_peer=node,
                                                   max_payload=ROUND_MAX_PAYLOAD, timeout=timeout), timeout)

    holder["probe"] = LaneProbe(a.lane, a.worker, asyncio.get_running_loop(), ask)
    return holder["probe"], a, b


async def timed_probe(probe: LaneProbe, timeout: float) -> tuple[bool, float]:
    t0 = time.monotonic()
    answered = await probe.probe("b", timeout)
    return answered, time.monotonic() - t0


async def test_a_peer_whose_thread_turns_over_and_does_not_answer_is_given_up_on_after_a_grace():
    probe, a, b = await prober_and_peer(answers=False)
    try:
        answered, took = await timed_probe(probe, FIRST_WAIT_S + 20.0)
        assert not answered
        assert FIRST_WAIT_S <= took < 8.0, took  # about FIRST_WAIT_S + GRACE_S; not the 20 s allowed for a pass
    finally:
        await a.stop()
        await b.stop()


async def test_a_peer_at_a_long_pass_gets_the_whole_allowance_and_answers_after_it():
    probe, a, b = await prober_and_peer(answers=True)
    try:
        b.worker.post(time.sleep, 2.0)  # its MLX thread computes: our probe waits in its socket meanwhile
        answered, took = await timed_probe(probe, FIRST_WAIT_S + 10.0)
        assert answered and took >= 1.5, took
    finally:
        await a.stop()
        await b.stop()


async def test_a_peer_that_does_not_say_gets_the_whole_allowance():
    probe, a, b = await prober_and_peer(answers=False, tells_rounds=False)
    try:
        answered, took = await timed_probe(probe, FIRST_WAIT_S + 2.0)
        assert not answered and took >= FIRST_WAIT_S + 1.9, took
    finally:
        await a.stop()
        await b.stop()


def test_the_mlx_thread_keeps_its_longest_recent_round():
    worker = MlxWorker(tidy_heap=False)
    try:
        assert worker.longest_round() == 0.0
        worker.submit(time.sleep, 0.3).result()
        assert 0.3 <= worker.longest_round() < 5
        started, release = threading.Event(), threading.Event()
        running = worker.submit(lambda: (started.set(), release.wait(30)))
        assert started.wait(30)
        time.sleep(0.6)
        assert worker.longest_round() >= 0.6  # the round under way counts as it runs
        release.set()
        running.result()
    finally:
        worker.close()
