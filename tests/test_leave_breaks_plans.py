"""A member that leaves breaks every request through it, on the plan before too (planning/coordinator.py).

A member left out for taking no data makes a new plan without it, while the plan before (with it) is
kept whole for the requests it carries: the member may only be slow. When liveness then says it is
gone, the requests still on the plan before must break and replay at once; they waited out the token
timeout (seen in test_churn_netns.py: a stream paused 120 s after a kill). A fixed view stands for
discovery."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fixed_view import SPEC, FixedView

from discovery.view import PeerEvent
from partitioner import make_plan
from swarm.events import EventBus
from swarm.planning.coordinator import Coordinator
from swarm.planning.load_deadlines import LoadDeadlines

pytestmark = pytest.mark.timeout(30)


async def test_a_member_that_leaves_breaks_the_plan_before_that_still_holds_it():
    view = FixedView("a", {"a": {}, "b": {}, "s": {}})
    coord = Coordinator("a", SPEC, "fp", view, None, EventBus(), deadlines=LoadDeadlines("a"))
    broken: list[tuple[str, frozenset[str]]] = []
    coord.on_plans_broken.append(lambda reason, whole: broken.append((reason, whole)))
    with_s = make_plan(SPEC, coord.members(), coord.strategy)
    coord.host = SimpleNamespace(plan_id=with_s.plan_id)
    for node in ("b", "s"):
        view.extras[node] = {"plan": with_s.plan_id}  # every stage serves it
    coord.plan = with_s
    coord._note_agreement()
    assert coord.before is with_s
    # s is left out for taking no data: the plan without it is the newest, the one with it stays whole.
    s_profile = next(p.profile for p in view.view() if p.node_id == "s")
    del view.extras["s"]
    without_s = make_plan(SPEC, coord.members(), coord.strategy)
    coord.plan = without_s
    assert "s" not in {st.node_id for st in without_s.stages} and coord.before is with_s
    await coord.on_peer_event(PeerEvent("leave", "s", s_profile))
    assert broken, "nothing broke: requests on the plan before wait out the token timeout"
    reason, whole = broken[0]
    assert "s left" in reason and with_s.plan_id not in whole, broken
    await coord.slow.stop()


async def test_a_leave_of_a_node_in_no_plan_breaks_nothing():
    view = FixedView("a", {"a": {}, "b": {}})
    coord = Coordinator("a", SPEC, "fp", view, None, EventBus(), deadlines=LoadDeadlines("a"))
    broken: list = []
    coord.on_plans_broken.append(lambda reason, whole: broken.append((reason, whole)))
    plan = make_plan(SPEC, coord.members(), coord.strategy)
    coord.host = SimpleNamespace(plan_id=plan.plan_id)
    view.extras["b"] = {"plan": plan.plan_id}
    coord.plan = plan
    coord._note_agreement()
    stranger = next(p.profile for p in FixedView("a", {"x": {}}).view())
    await coord.on_peer_event(PeerEvent("leave", "x", stranger))
    assert broken == []
    await coord.slow.stop()
