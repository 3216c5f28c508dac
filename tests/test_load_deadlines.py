"""Stages that do not serve their plan in time are left out for a while (planning/load_deadlines.py).

Time is a hand-moved clock here: the rule is about durations, and the real-time behaviour is
shown against real nodes (test_membership_netns.py)."""

from __future__ import annotations

from partitioner import ModelSpec, Plan, Stage

from swarm.planning.load_deadlines import Announced, LoadDeadlines


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plan(plan_id: str, *nodes: str) -> Plan:
    stages = tuple(Stage(n, i, i + 1) for i, n in enumerate(nodes))
    return Plan(ModelSpec(len(nodes), 10), "balanced", stages, (), 0.0, plan_id)


def deadlines(clock: Clock) -> LoadDeadlines:
    return LoadDeadlines("me", short_s=6, loading_s=60, first_out_s=30, max_out_s=100, clock=clock)


def test_a_stage_that_never_serves_is_left_out_after_the_short_deadline_and_tried_again_later():
    clock, d = Clock(), None
    d = deadlines(clock)
    p = plan("p1", "me", "hole", "ok")
    d.adopt(p)
    said = {"ok": Announced(serving="p1"), "hole": Announced(serving="bogus")}
    clock.now += 5.9
    assert d.overdue(said) == []
    assert d.next_check(said) == 1006.0
    clock.now += 0.1
    assert d.overdue(said) == ["hole"]
    d.leave_out(["hole"])
    assert d.left_out() == {"hole"}
    clock.now += 29.9
    assert d.left_out() == {"hole"}
    clock.now += 0.1
    assert d.left_out() == set()  # tried again: a slow node gets back in
    d.adopt(p)
    clock.now += 6
    d.leave_out(d.overdue(said))
    clock.now += 59.9
    assert d.left_out() == {"hole"}  # the second time out is twice as long ...
    clock.now += 0.1
    d.adopt(p)
    clock.now += 6
    d.leave_out(d.overdue(said))
    clock.now += 99.9
    assert d.left_out() == {"hole"}  # ... up to the longest
    clock.now += 0.1
    assert d.left_out() == set()


def test_a_stage_loading_this_plan_gets_the_long_deadline_and_serving_clears_its_record():
    clock = Clock()
    d = deadlines(clock)
    p = plan("p1", "me", "slow")
    d.adopt(p)
    loading = {"slow": Announced(loading="p1")}
    clock.now += 59
    assert d.overdue(loading) == []
    clock.now += 1
    assert d.overdue(loading) == ["slow"]
    d.leave_out(["slow"])
    assert d.overdue({"slow": Announced(serving="p1")}) == []  # it served after all: its record is clear
    clock.now += 30
    d.adopt(p)
    clock.now += 60
    d.leave_out(d.overdue(loading))
    clock.now += 30
    assert d.left_out() == set()  # first time out again, not a doubled one


def test_the_clock_starts_when_a_stage_stops_serving_and_never_for_this_node():
    clock = Clock()
    d = deadlines(clock)
    d.adopt(plan("p1", "me", "other"))
    assert d.overdue({"other": Announced(serving="p1")}) == []
    clock.now += 1000  # long after the plan was adopted, the other node re-plans (its view moved on)
    assert d.overdue({"other": Announced(loading="p2")}) == []
    clock.now += 5.9
    assert d.overdue({"other": Announced(loading="p2")}) == []
    clock.now += 0.1
    assert d.overdue({"other": Announced(loading="p2")}) == ["other"]
    d.adopt(plan("p3", "me"))
    clock.now += 1000
    assert d.overdue({}) == []  # this node itself, never


def test_stages_loading_a_plan_wait_as_long_as_weights_move_and_no_longer():
    clock = Clock()
    d = deadlines(clock)
    p = plan("p1", "me", "fetcher", "waiter")
    d.adopt(p)

    def said(received: int) -> dict:
        return {"fetcher": Announced(loading="p1", received=received), "waiter": Announced(loading="p1")}

    received = 0
    for _ in range(10):  # ten minutes of a fetch that moves: nobody is late
        assert d.overdue(said(received)) == []
        clock.now += 59
        received += 1 << 20
    assert d.overdue(said(received)) == []
    clock.now += 59.9
    assert d.overdue(said(received)) == []
    clock.now += 0.1   # a minute without a byte: both are late (the waiter waits for nothing that moves)
    assert sorted(d.overdue(said(received))) == ["fetcher", "waiter"]
    # A stage that says it loads but has no fetch that grows has only the loading deadline.
    d.adopt(p)
    clock.now += 60
    assert sorted(d.overdue(said(received))) == ["fetcher", "waiter"]


def test_a_node_left_out_is_taken_back_early_once_a_first_time_out_until_it_serves_our_plan():
    clock = Clock()
    d = deadlines(clock)
    p = plan("p1", "me", "peer")
    d.adopt(p)
    clock.now += 6
    d.leave_out(d.overdue({"peer": Announced(serving="other")}))
    assert d.left_out() == {"peer"}
    assert d.take_back("peer") and d.left_out() == set()
    d.adopt(p)
    clock.now += 6
    d.leave_out(d.overdue({"peer": Announced(serving="other")}))
    assert not d.take_back("peer") and d.left_out() == {"peer"}  # a liar gets one early take-back ...
    clock.now += 23  # 29 s after the take-back
    assert not d.take_back("peer") and d.left_out() == {"peer"}
    clock.now += 1
    # ... per first time out: two nodes that left each other out at different moments meet again
    # within one, however long their time outs grew
    assert d.take_back("peer") and d.left_out() == set()
    d.adopt(p)
    clock.now += 6
    d.leave_out(d.overdue({"peer": Announced(serving="other")}))
    clock.now += 100
    assert d.left_out() == set()
    d.adopt(p)
    d.overdue({"peer": Announced(serving="p1")})  # it served our plan: its record is cleared ...
    d.adopt(plan("p2", "me", "peer"))
    clock.now += 6
    d.leave_out(d.overdue({"peer": Announced()}))
    assert d.take_back("peer")  # ... so it may be taken back early again
    assert not d.take_back("stranger")
