"""Turns the discovery view into a plan, loads our part of it, and says when the swarm agrees.

No master and no election: every node runs the same deterministic partitioner on
the same view. Each node announces the plan id it serves (in its profile) once its
layers are loaded; an entry node uses a plan only when every stage announces it.
Agreement is waited for on a condition, notified whenever the view or our own
layers change: nobody polls. Event loop only.

Our part of the newest plan is loaded (its weights fetched from peers first where we lack them)
by plan_loading.py; the plan before keeps serving while layers travel, and entries keep using it
until the new one is agreed.

A stage that does not serve our plan in time is left out of the next plans for a while
(load_deadlines.py), so one bad record cannot stop the swarm; and a node announces only a
plan it serves (idle nodes announce none). A member that takes no data on the data lane is left
out until it reads again, whatever it announces (slow_members.py).

A peer is planned only once it proved that it holds the layers it claims (`holds` in its
profile; proof_gate.py, layer_proofs.py), so records that claim the model cost the plans
nothing. This node plans itself without proof: a node that holds nothing yet fetches the layers
its own plan gives it, then claims them, and its peers plan it once it proved them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Callable

from discovery import Discovery
from discovery.profile_keys import FETCH_KEY, LOADING_KEY, PLAN_KEY
from discovery.view import PeerEvent
from partitioner import InsufficientMemoryError, ModelSpec, NodeCapacity, Plan, make_plan

from ..events import EventBus
from ..stage.stage_host import StageHost
from ..weights.peer_weights import PeerWeights, parse_fetch
from .errors import NoPipeline
from .layer_proofs import LayerProofs
from .link_view import members_links
from .proof_gate import ProofGate
from .load_deadlines import Announced, LoadDeadlines
from .plan_loading import PlanLoader
from .slow_members import PROFILE_FIELD, ProbeFn, SlowMembers
from .step_costs import longest_pass, overdue_after

log = logging.getLogger(__name__)

# After a pipeline broke, prefer waiting this long for a new plan (the liveness check
# declares a dead peer gone within 3 s) over replaying into the same broken plan.
NEW_PLAN_GRACE_S = 3.5
SUSPICION_RECHECK_S = 0.25  # how often a request waiting out a probe of its broken plan's stage looks again
# Plans remembered with their stages, so that a lost stage breaks every request through it, on whichever
# plan (plan ids recur as members come and go: a swarm makes few distinct plans).
PLANS_KEPT = 256
MADE_PLANS_KEPT = 64  # the partitioner's answers remembered by their inputs (_make_plan)
TAKE_BACK_EVERY_S = 0.5  # how often the deadline watch looks for nodes left out that caught up


async def _always_answers(_node: str, _timeout: float) -> bool:
    return True


class Coordinator:
    def __init__(self, node_id: str, spec: ModelSpec, fingerprint: str, discovery: Discovery, host: StageHost,
                 events: EventBus, *, strategy: str = "balanced",
                 recovery_timeout: float = 30.0, weights: PeerWeights | None = None,
                 deadlines: LoadDeadlines | None = None, proofs: LayerProofs | None = None,
                 probe: ProbeFn | None = None):
        """`probe`: asks a peer over the data lane whether it reads (node/lane_probe.py); None: every
        peer does (tests of planning alone). `weights`: None when this node never fetches (the same)."""
        self.node_id, self.spec, self.fingerprint, self.discovery = node_id, spec, fingerprint, discovery
        self.host, self.events = host, events
        # Told when requests on a plan may have lost a stage (reason, plan ids still whole): the entry's
        # pending tokens break, so that its requests replay at once (entry/pending_tokens.py).
        self.on_plans_broken: list[Callable[[str, frozenset[str]], None]] = []
        self.strategy, self.recovery_timeout = strategy, recovery_timeout
        self.deadlines = deadlines or LoadDeadlines(node_id)
        self.slow = SlowMembers(node_id, probe or _always_answers, self._slow_changed, busy_for=self.longest_pass)
        self.proofs = proofs  # None: every peer's claims are believed (tests of planning alone)
        self.gate = ProofGate(node_id, spec.n_layers, fingerprint, discovery, proofs, weights)
        self.plan: Plan | None = None
        self._plans: dict[tuple, Plan] = {}  # _make_plan's, by members, strategy and links
        self.before: Plan | None = None  # the last plan seen whole: used while the newest is fetched for
        # Every plan made, newest last (plan id -> its stages): requests may still run on one that is
        # neither of those two, as agreement moves on without breaking them.
        self._made: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._slow_out: set[str] = set()  # the members left out for taking no data, as last replanned
        self.plan_error: str | None = None
        self._watch_task: asyncio.Task | None = None
        self._changed = asyncio.Condition()  # the view, the plan or our layers changed
        self.loader = PlanLoader(node_id, discovery, host, events, self.gate, self.deadlines, weights,
                                 newest=lambda: self.plan, before=lambda: self.before, changed=self._changed,
                                 notify=self._notify)

    async def start(self) -> None:
        if self.proofs is not None:
            self.proofs.start()
        await self.gate.claim_held(None)
        await self.replan()
        self._watch_task = asyncio.create_task(self._watch_loads(), name="watch-loads")

    async def stop(self) -> None:
        await self.slow.stop()
        if self.proofs is not None:
            await self.proofs.stop()
        if self._watch_task is not None and not self._watch_task.done():
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
        await self.loader.stop()

    async def on_peer_event(self, event: PeerEvent, replan: bool = True) -> None:
        """`replan` False: more events follow at once (node.py hands over a burst), and `settle()` after
        the last plans once for them all."""
        if event.kind in ("join", "leave"):
            self.loader.membership_changed()
            self.events.emit(event.kind, {"node_id": event.node_id, "name": event.profile.name})
        if event.kind == "leave":
            self.break_plans_through(event.node_id, f"node {event.node_id} left")
            self.slow.forget(event.node_id)
            self._slow_out.discard(event.node_id)
        elif event.kind in ("join", "update"):
            self.slow.heard(event.node_id, event.profile.extra.get(PROFILE_FIELD),
                            {p.node_id for p in self.discovery.view()})
        if replan:
            await self.settle()

    async def settle(self) -> None:
        """Plan for the view as it is now, after peer events."""
        await self.replan()
        await self._notify()  # an update may be a peer announcing the plan it now serves

    def members(self, left_out: set[str] | None = None) -> list[NodeCapacity]:
        left_out = (self.deadlines.left_out() if left_out is None else left_out) | self.slow.left_out()
        return [NodeCapacity(p.node_id, p.profile.memory_available, p.profile.speed)
                for p in self.discovery.view(include_self=True)
                if p.profile.model_fingerprint == self.fingerprint and p.profile.speed > 0
                and p.node_id not in left_out and self.gate.plannable(p.profile, self.plan, self.before)]

    def _make_plan(self, members: list[NodeCapacity]) -> Plan:
        links = members_links(((p.node_id, p.profile) for p in self.discovery.view(include_self=True)),
                              {m.node_id for m in members})
        # The same members and links make the same plan (the partitioner is pure): each peer event and
        # each wake of the deadline watch asks again, for every node left out, and at 32 nodes a plan
        # with links that differ costs tens of milliseconds.
        key = (tuple(members), self.strategy, tuple(sorted(links.items())))
        plan = self._plans.get(key)
        if plan is None:
            plan = make_plan(self.spec, members, self.strategy, links=links)
            if len(self._plans) >= MADE_PLANS_KEPT:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def moves_layers(self, speed: float) -> bool:
        """Whether this node advertising `speed` would change how many layers a node holds (not only
        the stages' order, which the partitioner sorts fastest first: an order alone changes no token's
        trip over equal links, and a re-plan for it would replay every request in flight)."""
        if self.plan is None:
            return True
        members = [replace(m, seconds_per_layer=speed) if m.node_id == self.node_id else m for m in self.members()]
        try:
            plan = self._make_plan(members)
        except InsufficientMemoryError:
            return True
        return _layer_counts(plan) != _layer_counts(self.plan)

    def _describe(self, plan: Plan) -> str:
        """Each stage's layers and what it runs them on: "a[0,10) on cuda, 23.0 GiB gpu, ..."."""
        profiles = {p.node_id: p.profile for p in self.discovery.view(include_self=True)}
        parts = []
        for s in plan.stages:
            p = profiles.get(s.node_id)
            on = f"{p.backend}, {p.memory_available / 2**30:.1f} GiB {p.memory_kind}" if p else "?"
            parts.append(f"{s.node_id}[{s.start},{s.end}) on {on}")
        return "; ".join(parts)

    async def replan(self) -> None:
        self.gate.ask_for_proofs()
        try:
            plan, error = self._make_plan(self.members()), None
        except InsufficientMemoryError as e:
            plan, error = None, f"the swarm cannot hold the model: {e}"
        if error and error != self.plan_error:  # said once per new shortfall, not only in /health
            log.warning("%s; waiting for more nodes or memory", error)
        elif self.plan_error and not error:
            log.info("the swarm can hold the model again")
        self.plan_error = error
        if _id(plan) == _id(self.plan):
            return
        log.info("plan %s -> %s: %s", _id(self.plan), _id(plan), self._describe(plan) if plan else error)
        self._note_agreement()
        self.plan = plan
        self._remember(plan)
        self.deadlines.adopt(plan)
        self._plans_broken("the plan changed", frozenset(p.plan_id for p in (plan, self.before) if p is not None))
        self.events.emit("plan", {"plan": plan.to_dict() if plan else None, "error": error})
        await self._notify()
        self.loader.plan_changed()

    async def _slow_changed(self) -> None:
        """A member was left out for taking no data, or taken back: replan (the new plan's layers load
        meanwhile), break the requests through one left out (it may stay alive, so no leave would break
        them, and the plan before, kept whole, is one of theirs), and say so (peers check it too)."""
        out = self.slow.left_out()
        newly_out, self._slow_out = out - self._slow_out, out
        await self.replan()
        for node in sorted(newly_out):
            self.break_plans_through(node, f"node {node} takes no data")
        await self.discovery.update_profile(**{PROFILE_FIELD: self.slow.profile_field() or None})
        await self._notify()

    def overdue_after(self, plan: Plan, positions: int) -> float:
        """Seconds after which a sampled step of `plan` that computes `positions` positions is overdue."""
        return overdue_after(plan, {p.node_id: p.profile.speed for p in self.discovery.view(include_self=True)},
                             positions)

    def longest_pass(self, node: str) -> float:
        """The longest pass `node` may be computing for our plan (a probe of it waits that much longer)."""
        return longest_pass(self.plan, node, next((p.profile.speed for p in self.discovery.view()
                                                   if p.node_id == node), 0.0))

    def peer_stalled(self, node: str, problem: str) -> None:
        """Our data link to `node` took no data (transport/lane.py): it is left out."""
        self.slow.stalled(node, f"our link to it: {problem}")

    def step_overdue(self, plan: Plan, why: str) -> None:
        """A step through `plan` is overdue: its stages may take no data (probed: slow_members.py)."""
        self.slow.suspect([s.node_id for s in plan.stages], why)

    def break_plans_through(self, node: str, reason: str) -> None:
        """`node` is lost to our requests (it left, takes no data, or our link to it broke): those through it
        break, on every plan it is a stage of, not only the newest and the one before (agreement may have
        moved past a request's plan, and a replan, which keeps those two whole, broke nothing); requests on
        a plan without it go on."""
        self._remember(self.plan)
        self._remember(self.before)
        if any(node in stages for stages in self._made.values()):
            self._plans_broken(reason, frozenset(pid for pid, stages in self._made.items() if node not in stages))

    def _remember(self, plan: Plan | None) -> None:
        if plan is not None:
            self._made[plan.plan_id] = frozenset(s.node_id for s in plan.stages)
            self._made.move_to_end(plan.plan_id)
            while len(self._made) > PLANS_KEPT:
                self._made.popitem(last=False)

    def _plans_broken(self, reason: str, whole: frozenset[str] = frozenset()) -> None:
        for listener in self.on_plans_broken:
            listener(reason, whole)

    def _announced(self) -> dict[str, Announced]:
        def received(extra: dict) -> int:
            fetch = parse_fetch(extra.get(FETCH_KEY))
            return fetch["received_bytes"] if fetch else 0
        return {p.node_id: Announced(p.profile.extra.get(PLAN_KEY, ""), p.profile.extra.get(LOADING_KEY, ""),
                                     received(p.profile.extra))
                for p in self.discovery.view()}

    def _take_back_caught_up(self) -> None:
        """Nodes we leave out that announce (serving or loading) the plan we would make with them back in
        have caught up with our view: their time outs end now (load_deadlines.py)."""
        out = self.deadlines.left_out()
        if not out:
            return
        announced = self._announced()
        all_back = self._plan_id(set())
        for node in out:
            said = announced.get(node)
            plans = {said.serving, said.loading} - {""} if said else set()
            if plans and (all_back in plans or self._plan_id(out - {node}) in plans):
                self.deadlines.take_back(node)
        self._take_back_outnumbering(announced)

    def _take_back_outnumbering(self, announced: dict[str, Announced]) -> None:
        """Nodes we leave out that serve one plan among themselves, more of them than serve ours: we are
        the odd one out (we were slow, and left them out while they left us out), and each side would wait
        for the other to announce its plan until the time outs end. We take them back, so our plan is
        the one with them in, which they take us back for."""
        out = self.deadlines.left_out()
        ours = 1 + sum(1 for said in announced.values() if self.plan and said.serving == self.plan.plan_id)
        serving: dict[str, list[str]] = {}
        for node in out:
            said = announced.get(node)
            if said and said.serving and (self.plan is None or said.serving != self.plan.plan_id):
                serving.setdefault(said.serving, []).append(node)
        for nodes in serving.values():
            if len(nodes) > ours:
                for node in nodes:
                    self.deadlines.take_back(node)
        if ours == 1 and self.plan is not None and len(self.plan.stages) == 1 and \
                sum(map(len, serving.values())) == len(out):
            # Alone, and every node we left out serves a plan without us: each of them may be alone too
            # (they timed out on each other at different moments), and each retry would meet the others'
            # time outs. Alone, we take them all back at once (at most once a first time out), as they do.
            for nodes in serving.values():
                for node in nodes:
                    self.deadlines.take_back(node)

    def _plan_id(self, left_out: set[str]) -> str | None:
        try:
            return self._make_plan(self.members(left_out)).plan_id
        except InsufficientMemoryError:
            return None

    async def _watch_loads(self) -> None:
        """Leave out stages that miss their deadline, and take them back when their time out ends."""
        taken_at = -TAKE_BACK_EVERY_S
        while True:
            if self.loader.fetching:  # our peers plan us once we hold our layers: until then they are not late
                self.deadlines.restart_clocks()
            late = self.deadlines.overdue(self._announced())
            if late:
                self.deadlines.leave_out(late)
                await self.replan()
            was_out = self.deadlines.left_out()
            wake = self.deadlines.next_check(self._announced())
            timeout = None if wake is None else max(0.05, wake - time.monotonic())
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
            # At most every TAKE_BACK_EVERY_S: each look plans once per node left out, and a swarm of 32
            # announces changes many times a second (what changed meanwhile is read after the pause).
            await asyncio.sleep(max(0.0, taken_at + TAKE_BACK_EVERY_S - time.monotonic()))
            taken_at = time.monotonic()
            self._take_back_caught_up()
            if self.deadlines.left_out() != was_out:  # a time out ended: try that node again
                await self.replan()

    def waiting_for(self, plan: Plan) -> list[str]:
        """Stage nodes that do not serve `plan` yet (empty when the pipeline is whole)."""
        serving = {p.node_id: p.profile.extra.get(PLAN_KEY) for p in self.discovery.view(include_self=True)}
        serving[self.node_id] = self.host.plan_id
        return [s.node_id for s in plan.stages if serving.get(s.node_id) != plan.plan_id]

    def status(self) -> tuple[bool, str]:
        """(can serve now, why not)."""
        if self.plan is None:
            return False, self.plan_error or "no plan yet"
        waiting = self.waiting_for(self.plan)
        if waiting:
            return False, f"waiting for {', '.join(waiting)} to load plan {self.plan.plan_id}"
        return True, "ok"

    async def agreed_plan(self, broken: Plan | None = None) -> Plan:
        """A plan every stage serves, other than `broken` unless no other comes within the grace
        period; NoPipeline after recovery_timeout."""
        start = time.monotonic()
        async with self._changed:
            while True:
                plan, waited = self.plan, time.monotonic() - start
                if plan is not None and self.waiting_for(plan) and self.before is not None \
                        and not self.waiting_for(self.before):
                    plan = self.before  # the newest is still being fetched for; the one before serves
                if plan is not None and not self.waiting_for(plan):
                    if broken is None or broken.plan_id != plan.plan_id or \
                            (waited > NEW_PLAN_GRACE_S and not self._under_suspicion(plan)):
                        return plan
                    # the same plan is good enough then, unless a stage of it is being probed: look again soon
                    wake_by = max(NEW_PLAN_GRACE_S - waited, SUSPICION_RECHECK_S)
                else:
                    wake_by = self.recovery_timeout - waited
                if waited > self.recovery_timeout:
                    raise NoPipeline(f"no whole pipeline after {self.recovery_timeout:.0f}s: {self.status()[1]}")
                try:
                    await asyncio.wait_for(self._changed.wait(), max(0.001, min(wake_by, self.recovery_timeout - waited)))
                except asyncio.TimeoutError:
                    pass

    def _under_suspicion(self, plan: Plan) -> bool:
        """A stage of `plan` is being probed, or left out for taking no data: the plan will change."""
        return bool({s.node_id for s in plan.stages} & (self.slow.checking() | self.slow.left_out()))

    def _note_agreement(self) -> None:
        if self.plan is not None and not self.waiting_for(self.plan):
            self.before = self.plan

    async def _notify(self) -> None:
        self._note_agreement()
        async with self._changed:
            self._changed.notify_all()


def _layer_counts(plan: Plan) -> dict[str, int]:
    return {s.node_id: s.n_layers for s in plan.stages}


def _id(plan: Plan | None) -> str | None:
    return plan.plan_id if plan else None
