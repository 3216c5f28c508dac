"""The coordinator plans from the links every member advertises (planning/link_view.py): a member
whose links are slow is left out by every node alike; with no links, or SWARM_PLAN_LINKS=off, the
plan is the network-blind one."""

from __future__ import annotations

from fixed_view import FixedView

from partitioner import ModelSpec
from swarm.planning.coordinator import Coordinator
from swarm.planning.load_deadlines import LoadDeadlines

SPEC = ModelSpec(30, 10 << 20, activation_bytes=576 * 4)
FAST, SLOW = (0.0005, 1.25e9), (0.030, 1.25e9)


def coordinator(view: FixedView) -> Coordinator:
    return Coordinator(view.own, SPEC, "fp", view, None, None, deadlines=LoadDeadlines(view.own))


def links(me: str, ids: str, slow_to: set[str]) -> dict:
    return {peer: (SLOW if peer in slow_to or me in slow_to else FAST) for peer in ids if peer != me}


def test_every_node_leaves_out_the_member_whose_links_are_slow_and_plans_as_before_without_links(monkeypatch):
    monkeypatch.delenv("SWARM_PLAN_LINKS", raising=False)  # (on by default)
    ids = "abcd"
    measured = {n: links(n, ids, {"d"}) for n in ids}
    plans = set()
    for own in ids:
        coord = coordinator(FixedView(own, {n: {} for n in ids}, measured))
        plan = coord._make_plan(coord.members(set()))
        plans.add(plan.plan_id)
        assert [s.node_id for s in plan.stages] == ["a", "b", "c"]
        assert [i.node_id for i in plan.idle] == ["d"]
    assert len(plans) == 1
    without = coordinator(FixedView("a", {n: {} for n in ids}))
    assert [s.node_id for s in without._make_plan(without.members(set())).stages] == list(ids)


def test_with_swarm_plan_links_off_the_links_change_no_plan(monkeypatch):
    monkeypatch.setenv("SWARM_PLAN_LINKS", "off")
    ids = "abcd"
    coord = coordinator(FixedView("a", {n: {} for n in ids}, {n: links(n, ids, {"d"}) for n in ids}))
    assert [s.node_id for s in coord._make_plan(coord.members(set())).stages] == list(ids)


def test_a_member_behind_a_narrow_link_is_not_planned_where_activations_cross_it_twice(monkeypatch):
    """Same round trips, one member at 100 Mbit among 10 Gbit links: it goes first or last (the hop
    into the first stage carries a token, not activations) or is left out, by every node alike."""
    monkeypatch.delenv("SWARM_PLAN_LINKS", raising=False)
    ids = "abcd"
    narrow, wide = (0.0005, 12.5e6), (0.0005, 1.25e9)
    measured = {n: {p: (narrow if "b" in (n, p) else wide) for p in ids if p != n} for n in ids}
    plans = set()
    for own in ids:
        coord = coordinator(FixedView(own, {n: {} for n in ids}, measured))
        plan = coord._make_plan(coord.members(set()))
        plans.add(plan.plan_id)
        order = [s.node_id for s in plan.stages]
        assert "b" not in order[1:-1], order
    assert len(plans) == 1
    blind = coordinator(FixedView("a", {n: {} for n in ids}))
    assert [s.node_id for s in blind._make_plan(blind.members(set())).stages] == list(ids)  # (b second)
