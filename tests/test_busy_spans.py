"""When the MLX thread works (engine/busy_spans.py), on a fake clock: how long a frame read now may have
waited behind work, and how much work a span of time held."""

from __future__ import annotations

import pytest

from swarm.engine.busy_spans import KEPT, SLIGHT_S, BusySpans


def spans(*pairs: tuple[float, float], start: float = 0.0) -> BusySpans:
    busy = BusySpans(start)
    for begin, end in pairs:
        busy.begin(begin)
        busy.end(end)
    return busy


def test_an_idle_thread_was_quiet_since_it_began() -> None:
    assert BusySpans(10.0).quiet(12.5) == pytest.approx(2.5)
    assert BusySpans(10.0).worked(12.5) == 0.0


def test_quiet_reaches_back_to_the_last_work_longer_than_slight() -> None:
    busy = spans((1.0, 1.5), (2.0, 2.0002), (2.5, 2.5003))  # a pass, then two frames read
    # 0.5 ms of the slight 1 ms went on the two small spans: the quiet ends 0.5 ms into the pass's end
    assert busy.quiet(3.0) == pytest.approx(3.0 - (1.5 - (SLIGHT_S - 0.0005)))
    assert busy.worked(3.0) == pytest.approx(0.5005)


def test_work_under_way_counts_and_a_frame_read_in_a_pass_may_have_waited_it_all() -> None:
    busy = spans((1.0, 1.2))
    busy.begin(2.0)
    assert busy.quiet(2.5) == pytest.approx(SLIGHT_S)  # inside the pass: only `slight` back
    assert busy.worked(2.5) == pytest.approx(0.7)
    assert busy.worked_since(1.1, 2.5) == pytest.approx(0.1 + 0.5)
    assert busy.worked_since(2.4, 2.5) == pytest.approx(0.1)
    busy.end(2.6)
    assert busy.worked_since(2.7, 3.0) == 0.0
    assert busy.worked_since(1.5, 3.0) == pytest.approx(0.6)


def test_what_is_forgotten_counts_as_work() -> None:
    busy = spans(*((i * 0.01, i * 0.01 + 1e-5) for i in range(KEPT + 10)))
    newest = (KEPT + 9) * 0.01 + 1e-5
    assert busy.worked_since(0.0, newest) == pytest.approx(newest)  # before the kept spans: unknown
    assert busy.quiet(newest + 1, slight=1.0) < newest + 1  # never further back than what is known
