"""The speed a node advertises (node/present_speed.py), on a fake clock: noise never crosses the
hysteresis, a real slow-down does within a minute and so does its end, and an idle node never drifts."""

from __future__ import annotations

import random

from swarm.node.present_speed import PresentSpeed

BASE = 0.002  # seconds per layer per token
PASS_S = 0.05  # a decode pass every 50 ms while serving


def serve(speed: PresentSpeed, rng: random.Random, start: float, seconds: float, per_layer: float,
          noise: float = 0.25) -> list[float]:
    """Decode passes of `per_layer` seconds with noise (and rare spikes); the advertised speed after each check."""
    seen = []
    t, next_check = start, start + 1.0
    while t < start + seconds:
        sample = per_layer * (1 + rng.uniform(-noise, noise))
        if rng.random() < 0.02:
            sample *= 5  # a pass held up by something else on the machine
        speed.sample(t, sample)
        t += PASS_S
        if t >= next_check:
            speed.check(t)
            seen.append(speed.advertised)
            next_check += 1.0
    return seen


def test_ten_minutes_of_noise_never_cross_the_hysteresis():
    for seed in range(10):
        speed = PresentSpeed(BASE)
        seen = serve(speed, random.Random(seed), 0.0, 600.0, BASE)
        assert set(seen) == {BASE}, seed


def test_a_slow_machine_is_advertised_within_a_minute_and_back_within_a_minute():
    rng = random.Random(3)
    speed = PresentSpeed(BASE)
    serve(speed, rng, 0.0, 30.0, BASE)
    slowed = serve(speed, rng, 30.0, 60.0, BASE * 5)  # a CPU quota of 20%
    first_slow = next(i for i, s in enumerate(slowed) if s != BASE)
    assert first_slow < 60 and 3 * BASE < slowed[-1] < 7 * BASE and speed.slowed()
    back = serve(speed, rng, 90.0, 60.0, BASE)
    first_back = next(i for i, s in enumerate(back) if s < 2 * BASE)
    assert first_back < 60 and BASE / 1.3 <= back[-1] <= BASE * 1.3 and not speed.slowed()


def test_an_idle_node_never_drifts():
    speed = PresentSpeed(BASE)
    rng = random.Random(4)
    serve(speed, rng, 0.0, 5.0, BASE * 5)  # a few slow passes, then nothing for ten minutes
    for t in range(5, 600):
        assert speed.check(float(t)) is None
    assert speed.advertised == BASE


def test_nonsense_samples_are_ignored():
    speed = PresentSpeed(BASE)
    for t, bad in enumerate((float("nan"), float("inf"), -1.0, 0.0)):
        speed.sample(float(t), bad)
    assert speed.smoothed is None and speed.check(10.0) is None


def test_a_cached_speed_is_trusted_for_an_hour_only(tmp_path):
    from swarm.engine.speed_probe import CACHE_TTL_S, cached_speed
    measured = []

    def measure() -> float:
        measured.append(1)
        return 0.001 * len(measured)

    assert cached_speed(tmp_path, "k", measure, now=1000.0) == 0.001
    assert cached_speed(tmp_path, "k", measure, now=1000.0 + CACHE_TTL_S - 1) == 0.001  # a restart soon after
    assert cached_speed(tmp_path, "k", measure, now=1000.0 + CACHE_TTL_S + 1) == 0.002  # stale: measured again
    (tmp_path / "speed.json").write_text('{"k": 0.5}')  # an earlier build's entry: no age, not trusted
    assert cached_speed(tmp_path, "k", measure, now=5000.0) == 0.003
