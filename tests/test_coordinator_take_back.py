"""Two nodes that left each other out agree again as soon as one announces the plan the other would make
with it back in (planning/coordinator.py, load_deadlines.py). A fixed view stands for discovery: the rule
is about which plan ids the view yields; the real-time behaviour is shown against real nodes
(test_churn_netns.py, test_membership_netns.py)."""

from __future__ import annotations

from fixed_view import SPEC, FixedView

from swarm.planning.coordinator import Coordinator
from swarm.planning.load_deadlines import LoadDeadlines


def coordinator(view: FixedView) -> Coordinator:
    return Coordinator(view.own, SPEC, "fp", view, None, None, deadlines=LoadDeadlines(view.own))


def test_a_node_left_out_that_announces_our_plan_with_it_is_taken_back_and_a_stranger_plan_is_not():
    view = FixedView("a", {"a": {}, "b": {}, "c": {}})
    coord = coordinator(view)
    full = coord._plan_id(set())
    coord.deadlines.adopt(None)
    coord.deadlines.leave_out(["b", "c"])
    assert coord.deadlines.left_out() == {"b", "c"}
    view.extras["b"] = {"plan": "never-this-one"}  # a black hole's claim: stays out
    view.extras["c"] = {"loading": coord._plan_id({"b"})}  # c caught up with a, but for b
    coord._take_back_caught_up()
    assert coord.deadlines.left_out() == {"b"}
    view.extras["b"] = {"plan": full}  # b serves what a makes with everyone in
    coord._take_back_caught_up()
    assert coord.deadlines.left_out() == set()
    assert coord._plan_id(coord.deadlines.left_out()) == full


def test_the_odd_one_out_takes_back_the_nodes_that_agree_on_a_plan_without_it():
    """A member that was slow left the others out while they left it out, and each waited for the other to
    announce its plan: the node outnumbered by nodes serving one plan among themselves takes them back (its
    plan with them back in is then one they take it back for), and a lone claim does not move it."""
    view = FixedView("s", {"s": {}, "a": {}, "b": {}, "c": {}})
    coord = coordinator(view)
    coord.plan = coord._make_plan(coord.members({"a", "b", "c"}))  # s serves a plan of its own
    view.extras["s"] = {"plan": coord.plan.plan_id}
    coord.deadlines.adopt(coord.plan)
    coord.deadlines.leave_out(["a", "b", "c"])
    view.extras["c"] = {"plan": "c-alone"}
    coord._take_back_caught_up()
    assert coord.deadlines.left_out() == {"a", "b", "c"}  # one node's plan against ours: a tie
    view.extras["a"] = view.extras["b"] = {"plan": "a-and-b"}
    coord._take_back_caught_up()
    # a and b outnumber it; c too is back, since every node it left out now serves a plan of its own
    assert coord.deadlines.left_out() == set()


def test_nodes_alone_after_leaving_each_other_out_take_each_other_back():
    """Three nodes that timed out on each other at different moments each serve a plan of their own: no
    plan has more nodes than another, and each retry met another's time out. A node alone takes back every
    node it left out that serves a plan, at most once per first time out."""
    view = FixedView("a", {"a": {}, "b": {}, "c": {}})
    coord = coordinator(view)
    coord.plan = coord._make_plan(coord.members({"b", "c"}))
    view.extras["a"] = {"plan": coord.plan.plan_id}
    coord.deadlines.adopt(coord.plan)
    coord.deadlines.leave_out(["b", "c"])
    view.extras["b"], view.extras["c"] = {"plan": "b-alone"}, {"plan": "c-alone"}
    coord._take_back_caught_up()
    assert coord.deadlines.left_out() == set()
    coord.deadlines.leave_out(["b", "c"])  # again at once: not taken back early twice in a first time out
    coord._take_back_caught_up()
    assert coord.deadlines.left_out() == {"b", "c"}


def test_the_same_members_and_links_are_planned_once(monkeypatch):
    """Every peer event and every wake of the deadline watch plans again, for each node left out: the same
    members and links make the same plan (the partitioner is pure), computed once."""
    from swarm.planning import coordinator as coordinator_module
    made = []
    make_plan = coordinator_module.make_plan
    monkeypatch.setattr(coordinator_module, "make_plan", lambda *a, **k: made.append(1) or make_plan(*a, **k))
    links = {"a": {"b": (0.001, 0.0), "c": (0.009, 0.0)}, "b": {"a": (0.001, 0.0), "c": (0.001, 0.0)}}
    view = FixedView("a", {"a": {}, "b": {}, "c": {}}, links=links)
    coord = coordinator(view)
    plans = {coord._plan_id(set()) for _ in range(5)} | {coord._plan_id({"c"}) for _ in range(5)}
    assert len(plans) == 2 and len(made) == 2
    links["a"]["c"] = (0.002, 0.0)  # a link measured anew: planned again
    coord._plan_id(set())
    assert len(made) == 3
