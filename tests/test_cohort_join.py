"""A request's first decode step joins the steps out at its entry (entry/cohort_join.py)."""

from __future__ import annotations

from swarm.engine.sampling import SamplingParams
from swarm.entry.cohort_join import CohortJoin
from swarm.entry.run_ahead import NextStep
from swarm.transport.messages import Forward

GREEDY = SamplingParams(temperature=0.0)


def _step(rid: str, pos: int, to: str = "stage0", entry: str = "entry") -> NextStep:
    return NextStep(to, Forward.of_tokens(rid, "planA", pos, entry, GREEDY, [1]), 0.0)


def _sent(join: CohortJoin, *steps: NextStep) -> None:
    for s in steps:
        join.mlx_sent(s.to, s.forward)


def _rids(steps) -> list[str]:
    return [s.forward.rid for s in steps]


def test_a_lone_request_never_waits() -> None:
    join = CohortJoin("entry")
    _sent(join, _step("r1", 9))
    assert _rids(join.mlx_token("r1", 10, _step("r1", 10))) == ["r1"]


def test_a_first_decode_step_joins_the_steps_out() -> None:
    join = CohortJoin("entry")
    _sent(join, _step("r1", 20), _step("r2", 7))  # r1 decodes; r2's last prompt token is out
    assert join.mlx_token("r2", 8, _step("r2", 8)) == [] and join.held == 1, "r2 waits for r1's step"
    assert _rids(join.mlx_token("r1", 21, _step("r1", 21))) == ["r2", "r1"], "they leave side by side"
    _sent(join, _step("r2", 8), _step("r1", 21))
    assert _rids(join.mlx_token("r2", 9, _step("r2", 9))) == ["r2"], "once decoding, never held"


def test_only_our_own_sampled_steps_into_a_first_stage_count_as_out() -> None:
    join = CohortJoin("entry")
    join.mlx_sent("stage1", Forward.of_tokens("x", "planA", 5, "other-entry", GREEDY, [1]))
    join.mlx_sent("stage0", Forward.of_tokens("p", "planA", 0, "entry", None, [1, 2, 3]))  # a prompt chunk
    join.mlx_sent("stage9", _step("q", 3, to="stage9").forward)  # another plan's first stage
    assert _rids(join.mlx_token("r1", 10, _step("r1", 10))) == ["r1"]


def test_held_steps_leave_once_nothing_else_is_out() -> None:
    for end in ("error", "eos", "released", "late"):
        join = CohortJoin("entry")
        _sent(join, _step("r1", 20), _step("r2", 7))
        assert join.mlx_token("r2", 8, _step("r2", 8)) == []
        if end == "error":
            send = join.mlx_error("r1")
        elif end == "eos":  # r1's token ends it: no next step
            send = join.mlx_token("r1", 21, None)
        elif end == "released":  # r1's client left
            send = join.mlx_released("r1")
        else:
            assert join.mlx_token("r1", 99, None) == [], "another position's token: r1's step is still out"
            send = join.mlx_released("r1")
        assert _rids(send) == ["r2"], end
    join = CohortJoin("entry")
    _sent(join, _step("r1", 20), _step("r2", 7))
    join.mlx_token("r2", 8, _step("r2", 8))
    assert join.mlx_released("r2") == [] and join.held == 0, "a held request's release drops its step"
    assert _rids(join.mlx_token("r1", 21, _step("r1", 21))) == ["r1"]
