"""Which members planning leaves out for taking no data, and when it takes them back (planning/slow_members.py,
planning/coordinator.py). The probe stands for the data lane's (node/lane_probe.py, shown against real nodes
in test_slow_members_netns.py): here a set of the nodes that answer; a fixed view stands for discovery."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from fixed_view import SPEC, FixedView

from partitioner import NodeCapacity, make_plan

from swarm.planning import coordinator as coordinator_module
from swarm.engine.input_limits import MAX_CHUNK
from swarm.planning import slow_members, step_costs
from swarm.planning.coordinator import Coordinator
from swarm.planning.load_deadlines import Announced, LoadDeadlines
from swarm.planning.slow_members import SlowMembers

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(slow_members, "RETRY_S", 0.05)
    monkeypatch.setattr(slow_members, "HEARSAY_GAP_S", 0.0)


class Probes:
    """The nodes that answer a probe now, and every probe asked for."""

    def __init__(self, answering: set[str]):
        self.answering, self.asked = answering, []

    async def __call__(self, node: str, _timeout: float) -> bool:
        self.asked.append(node)
        await asyncio.sleep(0)
        return node in self.answering


async def settle(condition, timeout: float = 5.0) -> None:
    async def wait():
        while not condition():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(wait(), timeout)


async def test_a_stalled_link_leaves_its_peer_out_until_it_answers_a_probe_again() -> None:
    probes, changes = Probes(set()), []

    async def changed():
        changes.append(slow.left_out())
    slow = SlowMembers("a", probes, changed)
    slow.stalled("s", "our link took no data")
    assert slow.left_out() == {"s"}  # proof enough: no probe first
    await settle(lambda: probes.asked.count("s") >= 3)  # still probed while out; still out
    assert slow.left_out() == {"s"}
    probes.answering.add("s")  # it reads again
    await settle(lambda: not slow.left_out())
    assert changes == [{"s"}, set()]
    await slow.stop()


async def test_hearsay_leaves_out_only_a_member_that_does_not_answer_and_a_slow_members_word_counts_for_nothing():
    probes = Probes({"b"})
    slow = SlowMembers("a", probes, lambda: asyncio.sleep(0))
    slow.heard("liar", "b,s,a,stranger", members={"b", "s", "liar"})  # (never itself, never a non-member)
    await settle(lambda: "s" in slow.left_out())
    await asyncio.sleep(0.05)
    assert slow.left_out() == {"s"} and set(probes.asked) >= {"b", "s"} and "stranger" not in probes.asked
    slow.stalled("liar", "took no data")
    asked = len(probes.asked)
    slow.heard("liar", "b", members={"b", "s", "liar"})
    await asyncio.sleep(0.02)
    assert "b" not in probes.asked[asked:]
    await slow.stop()


async def test_a_member_another_node_took_back_is_probed_at_once(monkeypatch) -> None:
    probes = Probes(set())
    slow = SlowMembers("a", probes, lambda: asyncio.sleep(0))
    monkeypatch.setattr(slow_members, "RETRY_S", 60.0)  # (no probe of its own before the hearsay)
    slow.heard("b", "s", members={"b", "s"})
    await settle(lambda: slow.left_out() == {"s"})
    probes.answering.add("s")
    slow.heard("b", "", members={"b", "s"})  # b took it back
    await settle(lambda: not slow.left_out())
    await slow.stop()


async def test_a_member_that_announces_the_plan_but_takes_no_data_stays_out_of_the_plans() -> None:
    view = FixedView("a", {"a": {}, "b": {}, "s": {}})
    coord = Coordinator("a", SPEC, "fp", view, None, None, deadlines=LoadDeadlines("a"))
    coord.slow = SlowMembers("a", Probes({"b"}), lambda: asyncio.sleep(0))  # (no replanning here: no node parts)
    full = coord._plan_id(set())
    coord.deadlines.adopt(None)
    view.extras["s"] = {"plan": full, "state": "serving"}  # what a slow insider announces
    coord.slow.stalled("s", "our link took no data")
    assert {m.node_id for m in coord.members()} == {"a", "b"}
    assert coord.deadlines.overdue({"s": Announced(full)}) == []  # serving our plan: no black hole
    coord._take_back_caught_up()  # announcing the plan with it back in does not take it back either
    assert {m.node_id for m in coord.members()} == {"a", "b"}
    assert coord._plan_id(set()) != full
    await coord.slow.stop()


async def test_the_same_broken_plan_is_not_taken_again_while_a_stage_of_it_is_probed(monkeypatch) -> None:
    monkeypatch.setattr(coordinator_module, "NEW_PLAN_GRACE_S", 0.05)
    view = FixedView("a", {"a": {}, "b": {}, "s": {}})
    coord = Coordinator("a", SPEC, "fp", view, None, None, deadlines=LoadDeadlines("a"))
    answer = asyncio.Event()

    async def probe(node: str, _timeout: float) -> bool:
        await answer.wait()
        return True
    coord.slow = SlowMembers("a", probe, lambda: asyncio.sleep(0))
    coord.plan = make_plan(SPEC, coord.members(), coord.strategy)
    coord.host = SimpleNamespace(plan_id=coord.plan.plan_id)
    for node in ("b", "s"):
        view.extras[node] = {"plan": coord.plan.plan_id}  # every stage serves it: whole, but it broke
    coord.step_overdue(coord.plan, "no token")
    again = asyncio.ensure_future(coord.agreed_plan(broken=coord.plan))
    await asyncio.sleep(0.5)  # ten grace periods
    assert not again.done()
    answer.set()  # s answered: the plan is good enough again
    assert (await asyncio.wait_for(again, 5)).plan_id == coord.plan.plan_id
    await coord.slow.stop()


def test_a_probe_waits_out_the_longest_pass_a_stage_may_run_and_a_stated_speed_cannot_buy_more():
    plan = make_plan(SPEC, [NodeCapacity(n, 8 << 30, 0.002) for n in ("a", "b", "s")], "balanced")
    layers = {s.node_id: s.end - s.start for s in plan.stages}
    assert step_costs.longest_pass(plan, "b", 0.002) == pytest.approx(
        layers["b"] * 0.002 * MAX_CHUNK / step_costs.PREFILL_SPEEDUP)
    assert step_costs.longest_pass(plan, "stranger", 0.002) == 0.0  # not a stage: computes nothing for us
    assert step_costs.longest_pass(plan, "s", 1e6) == step_costs.MAX_S  # a liar's claim is capped
    assert step_costs.overdue_after(plan, {"s": 1e6}, 1) == step_costs.MAX_S
    assert step_costs.overdue_after(plan, {}, 1) == step_costs.OVERDUE_FLOOR_S
