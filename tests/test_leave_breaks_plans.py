"""A member lost to the entry breaks every request through it, on whichever plan (planning/coordinator.py).

A member left out for taking no data makes a new plan without it, while the plan before (with it) is
kept whole by the replan. When liveness then says it is gone, or the link to it breaks, or it was left
out alive, the requests still on a plan with it must break and replay at once: they waited out the
token timeout (seen in test_churn_netns.py: a stream paused 120 s after a kill), also once agreement
had moved on to the plan without it. A fixed view stands for discovery."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from fixed_view import SPEC, FixedView

from discovery.view import PeerEvent
from partitioner import make_plan
from swarm.entry.entry_inbox import EntryInbox
from swarm.entry.pending_tokens import PendingTokens
from swarm.entry.pipeline import PipelineBroken
from swarm.entry.run_ahead import RunAhead
from swarm.events import EventBus
from swarm.planning import slow_members
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


def coordinator(view: FixedView, monkeypatch, probe=None) -> tuple[Coordinator, PendingTokens]:
    """Node a's coordinator, its entry's pending tokens broken as the node wires them (node/assembly.py)."""
    coord = Coordinator("a", SPEC, "fp", view, SimpleNamespace(plan_id=None), EventBus(), deadlines=LoadDeadlines("a"),
                        probe=probe)
    monkeypatch.setattr(coord.loader, "plan_changed", lambda: None)  # (no layers to load here)
    pending = PendingTokens()
    coord.on_plans_broken.append(pending.break_all)
    return coord, pending


async def newest_agreed(coord: Coordinator, view: FixedView):
    """The plan made from the view now, served by every stage (the coordinator saw that)."""
    await coord.replan()
    plan = coord.plan
    coord.host = SimpleNamespace(plan_id=plan.plan_id)
    for s in plan.stages:
        if s.node_id != coord.node_id:
            view.extras[s.node_id] = {"plan": plan.plan_id}
    coord._note_agreement()
    assert coord.before is plan
    return plan


def waiting_on(pending: PendingTokens, plan, rid: str = "r1") -> asyncio.Future:
    """A request's wait for its next token through `plan` (the token timeout far away)."""
    return asyncio.ensure_future(pending.wait(rid, pending.expect(rid, plan.plan_id, 10), 3600))


async def broke(wait: asyncio.Future, within: float = 5.0) -> str:
    with pytest.raises(PipelineBroken) as broken:
        await asyncio.wait_for(wait, within)
    return str(broken.value)


async def test_a_leave_breaks_requests_on_a_plan_that_agreement_already_moved_on_from(monkeypatch):
    # The race seen in test_churn_netns.py (a stream paused 120 s): a stage of the request's plan died; a
    # probe found it first and left it out, and the plan without it was agreed (the plan before moved on)
    # before its link's break or its leave could name the request's plan. The leave must break it then.
    view = FixedView("a", {"a": {}, "b": {}, "s": {}})
    coord, pending = coordinator(view, monkeypatch)
    with_s = await newest_agreed(coord, view)
    wait = waiting_on(pending, with_s)
    s_profile = next(p.profile for p in view.view() if p.node_id == "s")
    del view.extras["s"]
    without_s = await newest_agreed(coord, view)
    assert "s" not in {st.node_id for st in without_s.stages}
    await asyncio.sleep(0.05)
    assert not wait.done()  # the plan with s moving out of sight broke nothing by itself
    await coord.on_peer_event(PeerEvent("leave", "s", s_profile))
    assert "s left" in await broke(wait)
    await coord.slow.stop()


async def test_a_broken_link_breaks_requests_through_its_peer_on_a_plan_planning_left_behind(monkeypatch):
    # The other half of that race: the link to the dead stage broke after the plan without it was made.
    view = FixedView("a", {"a": {}, "b": {}, "s": {}})
    coord, pending = coordinator(view, monkeypatch)
    inbox = EntryInbox("a", None, pending, RunAhead("a"), asyncio.get_running_loop(), None, None,
                       stage_lost=coord.break_plans_through)
    with_s = await newest_agreed(coord, view)
    through_s = waiting_on(pending, with_s, "r1")
    del view.extras["s"]
    await coord.replan()
    elsewhere = waiting_on(pending, coord.plan, "r2")
    inbox.mlx_link_broken("s", "connection reset")
    assert "the link to s broke" in await broke(through_s)
    await asyncio.sleep(0.05)
    assert not elsewhere.done()  # a request on a plan without s goes on
    elsewhere.cancel()
    await coord.slow.stop()


async def test_a_member_left_out_as_slow_that_stays_alive_breaks_the_requests_through_it(monkeypatch):
    # It answers liveness checks, so no leave comes: requests on the plan with it must replay now,
    # not wait out the token timeout on the plan before (kept whole for them).
    monkeypatch.setattr(slow_members, "HEARSAY_GAP_S", 0.0)
    view = FixedView("a", {"a": {}, "b": {}, "s": {}})

    async def probe(node: str, _timeout: float) -> bool:
        return node != "s"  # s reads nothing of its data lane
    coord, pending = coordinator(view, monkeypatch, probe)
    with_s = await newest_agreed(coord, view)
    wait = waiting_on(pending, with_s)
    coord.step_overdue(with_s, "no token of request r1 after 1.0 s")
    assert "s takes no data" in await broke(wait)
    assert "s" not in {st.node_id for st in coord.plan.stages}
    await coord.slow.stop()
