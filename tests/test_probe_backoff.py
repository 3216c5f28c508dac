"""ProbeBackoff on its own clock: a failing endpoint is asked less and less, an answer resets it."""

from __future__ import annotations

from discovery.probe_backoff import ProbeBackoff


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_endpoint_that_keeps_failing_is_asked_less_and_less_and_an_answer_resets_it():
    clock = Clock()
    backoff = ProbeBackoff(free_tries=2, base_s=1.0, max_s=8.0, per_round=100, clock=clock, jitter=lambda: 0.5)
    asked_at = []
    for _ in range(400):  # 40 s in rounds of 0.1 s
        if backoff.due(["ghost"]):
            asked_at.append(clock.now)
            backoff.failed("ghost")
        clock.now += 0.1
    gaps = [round(b - a, 1) for a, b in zip(asked_at, asked_at[1:])]
    # Two free tries, then 1, 2, 4, 8 s and 8 s from then on (give or take the 0.1 s rounds).
    expected = [0.1, 0.1, 1.0, 2.0, 4.0] + [8.0] * (len(gaps) - 5)
    assert len(gaps) > 6 and all(abs(g - e) <= 0.11 for g, e in zip(gaps, expected)), gaps
    backoff.answered("ghost")
    assert backoff.due(["ghost"]) == ["ghost"] and backoff.failures("ghost") == 0


def test_at_most_per_round_endpoints_are_asked_longest_due_first():
    clock = Clock()
    backoff = ProbeBackoff(free_tries=0, base_s=1.0, max_s=1.0, per_round=16, clock=clock, jitter=lambda: 0.5)
    ghosts = [f"ghost-{i:03d}" for i in range(200)]
    asked = []
    for _ in range(50):  # 50 rounds of 0.75 s
        now = backoff.due(ghosts)
        assert len(now) <= 16
        asked += now
        for g in now:
            backoff.failed(g)
        clock.now += 0.75
    assert len(asked) <= 16 * 50
    assert len(set(asked)) == 200  # nobody starves


def test_records_of_endpoints_no_longer_given_are_dropped():
    backoff = ProbeBackoff(free_tries=0, clock=Clock())
    backoff.failed("a")
    assert backoff.failures("a") == 1
    backoff.due(["b"])
    assert backoff.failures("a") == 0
