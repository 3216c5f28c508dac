"""What a node's own probing costs stays bounded as the swarm grows: link-meter pings (node/link_meter.py)
and liveness rounds (discovery/liveness.py) space out beyond a few peers, and the links a node measures are
published a few at a time, not one publication (one re-plan at every peer) per link.

The meter is driven tick by tick on a clock of the test's own; its MLX-thread pings are only recorded.
"""

from __future__ import annotations

import asyncio

from discovery import liveness
from swarm.node import link_meter
from swarm.node.link_meter import LinkMeter


class RecordingWorker:
    """Stands in for the MLX thread: records each ping the meter posts and answers it at once (an answer
    that is no sample: the meter's pace, not its estimates, is under test)."""

    def __init__(self) -> None:
        self.pings: list[tuple[str, int]] = []
        self.meter: LinkMeter | None = None

    def post(self, fn, peer, nonce, pad) -> None:
        self.pings.append((peer, pad))
        self.meter._sampled(peer, nonce, None, pad)


def meter_with(peers: list[str], clock, published: list[dict]) -> tuple[LinkMeter, RecordingWorker]:
    worker = RecordingWorker()

    async def publish(links: dict) -> None:
        published.append(dict(links))

    meter = LinkMeter("me", lane=None, worker=worker, loop=asyncio.get_running_loop(), peers=lambda: peers,
                      publish=publish, clock=clock)
    worker.meter = meter
    return meter, worker


async def run_for(meter: LinkMeter, now: list[float], seconds: float) -> None:
    end = now[0] + seconds
    while now[0] < end:
        now[0] += link_meter.TICK_S
        await meter._tick()


async def test_pings_per_second_stay_bounded_with_31_peers_and_keep_their_pace_with_3():
    now = [0.0]
    for n_peers, most_per_s in ((3, 3 / link_meter.PING_EVERY_S), (31, link_meter.PINGS_PER_S)):
        meter, worker = meter_with([f"peer{i}" for i in range(n_peers)], lambda: now[0], [])
        await run_for(meter, now, 20.0)  # (the first round's dues are spread over one pace)
        worker.pings.clear()
        await run_for(meter, now, 120.0)
        rate = len(worker.pings) / 120.0
        assert 0.7 * most_per_s <= rate <= 1.15 * most_per_s, (n_peers, rate)
        assert {peer for peer, _ in worker.pings} == {f"peer{i}" for i in range(n_peers)}  # every peer asked


async def test_links_are_published_at_most_once_in_the_gap():
    now = [0.0]
    published: list[dict] = []
    meter, _ = meter_with([f"peer{i}" for i in range(8)], lambda: now[0], published)
    await meter._tick()  # (the peers enter the meter's table)
    at: list[float] = []
    for i in range(8):  # eight first estimates, one a second
        meter._peers[f"peer{i}"].estimate.rtt, meter._peers[f"peer{i}"].estimate.bw = 0.001, 1e8
        before = len(published)
        await run_for(meter, now, 1.0)
        at += [now[0]] * (len(published) - before)
    await run_for(meter, now, link_meter.PUBLISH_GAP_S)
    at += [now[0]] * (len(published) - len(at))
    assert len(published[-1]) == 8, "every link is published in the end"
    assert len(published) <= 2, published
    assert all(b - a >= link_meter.PUBLISH_GAP_S for a, b in zip(at, at[1:])), at


def test_liveness_rounds_keep_their_interval_up_to_15_peers_then_space_out():
    assert liveness.round_interval(0.75, 3) == 0.75
    assert liveness.round_interval(0.75, 15) == 0.75
    assert liveness.round_interval(0.75, 31) == 31 / liveness.PROBES_PER_S > 1.5
