"""What a node advertises of a link (node/link_estimate.py), on a fake clock: noise never moves it,
a real change does: a faster link within a minute, a slower one within three (a longer wait, so that a
stretch of long passes at either end never looks like a slow link)."""

from __future__ import annotations

import random

from discovery import link_costs
from swarm.node.link_estimate import BW_CAP, HOLD_S, RISE_WINDOW_S, LinkEstimate, advertised

PING_S = 2.0


def noisy_rtt(rng: random.Random, base: float) -> float:
    """A round trip on a loaded machine: mostly the link, sometimes a busy peer or a queue (up to 20x)."""
    spike = rng.random() < 0.2
    return base * (1 + rng.random() * 0.5) + (rng.random() * 20 * base if spike else 0.0)


def run(estimate: LinkEstimate, rng: random.Random, start: float, seconds: float, base: float,
        pad_every: int = 10, bw: float = 1e9) -> list[float]:
    """Samples every PING_S for `seconds`; returns the advertised round trip after each."""
    seen = []
    t = start
    n = 0
    while t < start + seconds:
        n += 1
        if n in (4, 5, 6) or n % pad_every == 0:
            estimate.padded_sample(t, noisy_rtt(rng, base) + 256 * 1024 / bw, 256 * 1024)
        else:
            estimate.rtt_sample(t, noisy_rtt(rng, base))
        seen.append(estimate.rtt)
        t += PING_S
    return seen


def test_ten_minutes_of_noise_never_change_what_is_advertised():
    for seed in range(20):
        rng = random.Random(seed)
        estimate = LinkEstimate()
        run(estimate, rng, 0.0, 60.0, 0.0003)
        first = (estimate.rtt, estimate.bw)
        assert first[0] is not None and first[1] > 0
        seen = run(estimate, rng, 60.0, 600.0, 0.0003)
        assert set(seen) == {first[0]} and estimate.bw == first[1], seed


def test_a_real_change_is_advertised_within_three_minutes_and_back_within_one():
    rng = random.Random(1)
    estimate = LinkEstimate()
    run(estimate, rng, 0.0, 60.0, 0.0003)
    fast = estimate.rtt
    seen = run(estimate, rng, 60.0, RISE_WINDOW_S + HOLD_S + 10, 0.030)  # 30 ms of delay from now on
    assert seen[-1] >= 0.030 * 2 ** (-1 / 6) and fast < 0.001
    assert seen.index(seen[-1]) * PING_S <= 180
    back = run(estimate, rng, 260.0, 60, 0.0003)
    assert back[-1] < 0.001  # fast again (to within the noise of a loopback round trip)


def test_bandwidth_is_measured_by_padded_pings_and_capped():
    rng = random.Random(2)
    slow = LinkEstimate()
    run(slow, rng, 0.0, 120.0, 0.0003, bw=12.5e6)  # 100 Mbit/s
    assert 12.5e6 / 1.5 < slow.bw < 12.5e6 * 1.5
    fast = LinkEstimate()
    run(fast, rng, 0.0, 120.0, 0.0003, bw=1.25e9)  # 10 Gbit/s: beyond what the probe tells
    assert fast.bw == link_costs.quantize(1.0, BW_CAP)[1]


def test_what_is_advertised_is_bounded_to_the_nearest():
    estimates = {}
    for i in range(100):
        e = LinkEstimate()
        e.rtt, e.bw = link_costs.quantize(1e-4 * (i + 1), 1e8)
        estimates[f"{i:016x}"] = e
    estimates["unmeasured"] = LinkEstimate()
    links = advertised(estimates, "self")
    assert len(links) == link_costs.MAX_LINKS
    assert set(links) == {f"{i:016x}" for i in range(link_costs.MAX_LINKS)}
    from discovery.profile import NodeProfile
    NodeProfile(node_id="self", name="n", swarm="s", api_port=1, peer_port=2, links=links)  # fits


def test_a_busy_stretch_of_four_minutes_never_makes_a_fast_link_look_slow():
    """A long prompt keeps both ends' MLX threads busy: pongs are read late and the padded pings look
    slow for minutes. The link is what it was before; a link that really got slower shows once a
    whole window saw nothing faster."""
    rng = random.Random(3)
    estimate = LinkEstimate()
    run(estimate, rng, 0.0, 60.0, 0.0003, bw=1e9)
    before = estimate.bw
    busy = run(estimate, rng, 60.0, 240.0, 0.0003, bw=5e6)  # every padded ping 50 ms late
    assert estimate.bw == before, (before, estimate.bw, busy[-1])
    run(estimate, rng, 300.0, 400.0, 0.0003, bw=5e6)  # it stays slow: it is the link now
    assert estimate.bw < before / 4


def test_a_minute_and_a_half_of_pongs_read_late_never_makes_a_link_look_far():
    rng = random.Random(5)
    estimate = LinkEstimate()
    run(estimate, rng, 0.0, 60.0, 0.0003)
    before = estimate.rtt
    late = [estimate.rtt_sample(60.0 + 2 * i, 0.0003 + 0.04 + rng.random() * 0.2) for i in range(45)]
    assert estimate.rtt == before, late


def test_without_samples_what_was_advertised_stays() -> None:
    """A swarm whose passes keep every round trip from being a sample (node/link_meter.py) keeps the last."""
    estimate = LinkEstimate()
    run(estimate, random.Random(3), 0.0, 60.0, 0.0003)
    advertised_then = (estimate.rtt, estimate.bw)
    for t in range(60, 3660, 2):
        estimate.check(float(t))
    assert (estimate.rtt, estimate.bw) == advertised_then and estimate.rtt is not None
    assert estimate.least_rtt() < 0.001
