"""Loads this node's part of the newest plan and announces it once held. Event loop only.

A node that lacks weights for its new layers fetches them from its peers first
(weights/peer_weights.py), still serving the plan it served, and announces
`ready=<plan>` when it holds them. Nodes switch to a new plan only once its new
members and its fetching members are ready, so the plan before keeps serving while
layers travel; entries keep using it until the new one is agreed (coordinator.py).

The plans and the condition are the coordinator's: every await here may see the plan
move on, and the loading goes round again for the newest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Awaitable, Callable

from discovery import Discovery, NodeState
from discovery.profile_keys import LAYERS_KEY, LOADING_KEY, MEM_USED_KEY, PLAN_KEY, READY_KEY, STATE_KEY
from partitioner import Plan

from ..events import EventBus
from ..stage.stage_host import StageHost
from ..weights.peer_weights import NotEnoughDisk, PeerWeights
from ..weights.transfer import FetchStuck
from .load_deadlines import LoadDeadlines
from .proof_gate import ProofGate

log = logging.getLogger(__name__)

RETRY_FETCH_S = 5.0  # a fetch that could not finish (no holder, no disk) is tried again this often at most
# Before fetching, the membership must have held still this long: nodes that start together join
# a second apart, and a fetch for a plan the next join replaces is mostly wasted.
SETTLE_S = 3.0
# Peers that are still learning the model from the swarm (their profile has no fingerprint yet) will
# be members within seconds: a fetch waits for them, this long at most (one looking for ever must not
# hold the swarm back).
PROSPECTS_WAIT_S = 30.0


def own_layers(plan: Plan | None, node_id: str) -> tuple[int, int] | None:
    """The layer range `plan` gives `node_id`; None: it is no stage of it."""
    for s in plan.stages if plan else ():
        if s.node_id == node_id:
            return s.start, s.end
    return None


class PlanLoader:
    def __init__(self, node_id: str, discovery: Discovery, host: StageHost, events: EventBus, gate: ProofGate,
                 deadlines: LoadDeadlines, weights: PeerWeights | None, *, newest: Callable[[], Plan | None],
                 before: Callable[[], Plan | None], changed: asyncio.Condition,
                 notify: Callable[[], Awaitable[None]]):
        """`newest`, `before`: the coordinator's plans (the newest, the last seen whole); `changed`: its
        condition, notified by `notify` whenever the view, the plan or our layers change. `weights`: None
        when this node never fetches (tests of planning alone)."""
        self.node_id, self.discovery, self.host, self.events = node_id, discovery, host, events
        self.gate, self.deadlines, self.weights = gate, deadlines, weights
        self._newest, self._before, self._changed, self._notify = newest, before, changed, notify
        self.fetching = False  # this node fetches for its plan: the stages it waits for are not late
        self._membership_changed = time.monotonic()
        self._task: asyncio.Task | None = None

    def membership_changed(self) -> None:
        """A peer joined or left: a fetch waits for the membership to hold still again."""
        self._membership_changed = time.monotonic()

    def plan_changed(self) -> None:
        """The newest plan changed: load it (a load under way sees the change itself and goes round again)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._apply(), name="apply-plan")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _apply(self) -> None:
        """Load our layers for the newest plan. Every await may see the plan move on, so
        the loop only ends when what it just applied and announced is still the plan."""
        while True:
            plan = self._newest()
            if plan is None:  # keep what we hold: capacity may come back
                self.host.plan = None
                await self.discovery.update_profile(extra={PLAN_KEY: "", STATE_KEY: NodeState.WAITING})
            else:
                layers = own_layers(plan, self.node_id)
                if not await self._fetch_for(plan, layers):
                    continue
                if layers:
                    await self.gate.claim_held(layers)
                # Fetched (or nothing to fetch): still "loading" this plan for the deadlines while the
                # plan's other members fetch theirs.
                await self.discovery.update_profile(extra={READY_KEY: plan.plan_id,
                                                           LOADING_KEY: plan.plan_id if layers else None})
                await self._wait_until_ready(plan)
                if plan is not self._newest():
                    continue
                held = self.host.runner.range if self.host.runner else None
                if layers and (held is None or (held.start, held.end) != layers):
                    log.info("loading layers [%d, %d) for plan %s", *layers, plan.plan_id)
                await self.discovery.update_profile(extra={
                    PLAN_KEY: "", STATE_KEY: NodeState.LOADING if layers else NodeState.IDLE,
                    LOADING_KEY: plan.plan_id if layers else None})
                try:
                    await self.host.assign(plan, layers)
                except Exception:
                    log.exception("could not load layers %s", layers)
                    await self.discovery.update_profile(extra={STATE_KEY: NodeState.FAILED, LOADING_KEY: None})
                    return
                if plan is not self._newest():
                    continue
                # Only a plan we hold layers of is announced: an announcement is a promise to serve it.
                await self.discovery.update_profile(extra={
                    PLAN_KEY: plan.plan_id if layers else "",
                    STATE_KEY: NodeState.SERVING if layers else NodeState.IDLE,
                    LOADING_KEY: None, LAYERS_KEY: f"{layers[0]}-{layers[1]}" if layers else "",
                    MEM_USED_KEY: str(self.host.weight_bytes)})
                await self._notify()
            if plan is self._newest():
                if plan is not None:
                    self.events.emit("plan_loaded", {"node_id": self.node_id, "plan_id": plan.plan_id})
                return

    async def _fetch_for(self, plan: Plan, layers: tuple[int, int] | None) -> bool:
        """Have the weights our layers of `plan` need (still serving the plan before); False: the
        plan moved on meanwhile, or the fetch failed and was waited out (go round again)."""
        if layers is None or self.weights is None or not await self.weights.lacks(*layers):
            return True
        await self.discovery.update_profile(extra={LOADING_KEY: plan.plan_id})  # for the deadlines: from now on
        first_look = time.monotonic()
        while (quiet := time.monotonic() - self._membership_changed) < SETTLE_S or \
                (self._prospects() and time.monotonic() - first_look < PROSPECTS_WAIT_S):
            await asyncio.sleep(max(SETTLE_S - quiet, 0.25))
            if plan is not self._newest():
                return False
        fetch = asyncio.create_task(self._fetch_stage(layers), name="fetch-weights")
        fetch.add_done_callback(lambda _: asyncio.ensure_future(self._notify()))  # wakes the wait below
        try:
            await self.discovery.update_profile(extra={STATE_KEY: NodeState.FETCHING, LOADING_KEY: plan.plan_id})
            async with self._changed:  # a fetch for a plan that is no longer ours stops
                await self._changed.wait_for(lambda: fetch.done() or plan is not self._newest())
            if not fetch.done():
                fetch.cancel()
                log.info("plan %s replaced while fetching for it: fetching for the new one", plan.plan_id)
                with contextlib.suppress(asyncio.CancelledError):
                    await fetch
                return False
            fetch.result()
            return plan is self._newest()
        except (FetchStuck, NotEnoughDisk) as e:
            log.warning("cannot load layers [%d, %d) yet: %s; trying again when the swarm changes", *layers, e)
            stuck = isinstance(e, FetchStuck)
            await self.discovery.update_profile(extra={STATE_KEY: NodeState.STUCK if stuck else NodeState.NO_DISK})
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), RETRY_FETCH_S)
                except asyncio.TimeoutError:
                    pass
            return False

    async def _fetch_stage(self, layers: tuple[int, int]) -> None:
        self.fetching = True
        try:
            await self.weights.ensure_stage(*layers)
        finally:
            self.fetching = False
            self.deadlines.restart_clocks()

    def _prospects(self) -> list[str]:
        """Peers learning the model this node serves (or whatever the swarm serves) from the swarm."""
        model_id = self.discovery.profile.model_id
        return [p.node_id for p in self.discovery.view()
                if not p.profile.model_fingerprint and p.profile.model_id in ("", model_id)
                and p.profile.state in (NodeState.LOOKING, NodeState.FETCHING)]

    async def _wait_until_ready(self, plan: Plan) -> None:
        """Until the members of `plan` that may still be fetching have its weights (or the plan moves on).

        Those are the nodes the plan before did not have (they joined) and the nodes saying they
        fetch; the others hold their layers already (they served the plan before)."""
        def pending() -> list[str]:
            before = self._before()
            old = {s.node_id for s in before.stages} if before is not None else set()
            profiles = {p.node_id: p.profile for p in self.discovery.view(include_self=True)}
            late = []
            for s in plan.stages:
                profile = profiles.get(s.node_id)
                extra = profile.extra if profile is not None else {}
                if extra.get(READY_KEY) == plan.plan_id or extra.get(PLAN_KEY) == plan.plan_id:
                    continue
                if s.node_id not in old or (profile is not None and profile.state is NodeState.FETCHING):
                    late.append(s.node_id)
            return late

        said = None
        async with self._changed:
            while plan is self._newest() and (late := pending()):
                if late != said:
                    log.info("plan %s: waiting for %s to hold their weights", plan.plan_id, ", ".join(late))
                    said = late
                await self._changed.wait()
