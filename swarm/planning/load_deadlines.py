"""Stages that do not load their plan in time ("black holes") are left out of the next plans.

A plan serves only once every stage announces it. A member that never does (a fast node's
record that never serves: a node stuck loading, a buggy one, a stranger's fake record) would
stop every chat for good. So each stage of our plan has a deadline from the moment the plan
became ours, or from when it was first seen not serving it: LOADING_S while it announces that it
is loading this very plan, SHORT_S otherwise (a node whose view differs from ours computes
another plan, says so, and catches up within a few seconds: a crashed peer is noticed by all
within 3 s). Weights that travel take longer than any fixed deadline: while any stage of the
plan receives weights from its peers (its `fetch` received bytes grow), the clocks of the stages
loading this plan start again, so a swarm waits for a fetch that moves and not for one that
stalls (LOADING_S without a byte). A stage past its deadline is left out of the plans for a while, doubling each
time it happens again (FIRST_OUT_S up to MAX_OUT_S), then taken back in: a node that was only
slow rejoins, a black hole costs one deadline per period. Serving a plan of ours clears its
record. This node never leaves itself out.

Each node keeps its own records, so on a loaded machine two nodes could leave each other out at
different times and then never agree again (each sees the other serve a plan without it; seen in
a CI run at load 13). So a node left out that announces the very plan we would make with it back
in has caught up with our view: the coordinator takes it back at once (`take_back`). At most once
per FIRST_OUT_S, since a liar that knows our plan's id could announce it too: it costs one short
deadline in that time. Once per series of time outs was not enough: two nodes whose time outs of
each other had grown apart (a node that joined beside a flood of records proved its peers late)
each took the other back once, then could meet only where both time outs ended together.

Event loop only (planning/coordinator.py). Time is the monotonic clock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from partitioner import Plan

log = logging.getLogger(__name__)

SHORT_S = 6.0
LOADING_S = 60.0
FIRST_OUT_S = 30.0
MAX_OUT_S = 600.0


@dataclass
class _Record:
    strikes: int = 0
    out_until: float = 0.0
    taken_back_at: float = float("-inf")  # when its time out was last ended early


@dataclass(frozen=True)
class Announced:
    """What a node says about plans in its profile."""

    serving: str = ""  # the plan it serves ("" while loading, or when it holds no layers)
    loading: str = ""  # the plan it is loading (fetching weights for it, or waiting for others who do)
    received: int = 0  # bytes of weights it received from peers so far (grows while it fetches)


class LoadDeadlines:
    def __init__(self, own_id: str, *, short_s: float = SHORT_S, loading_s: float = LOADING_S,
                 first_out_s: float = FIRST_OUT_S, max_out_s: float = MAX_OUT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.own_id, self.short_s, self.loading_s = own_id, short_s, loading_s
        self.first_out_s, self.max_out_s, self.clock = first_out_s, max_out_s, clock
        self._plan: Plan | None = None
        self._waiting_since: dict[str, float] = {}  # stages of our plan not serving it, since when
        self._records: dict[str, _Record] = {}
        self._received: dict[str, int] = {}  # what each stage of our plan had received when last seen

    def adopt(self, plan: Plan | None) -> None:
        """`plan` is ours from now: its stages' clocks start."""
        now = self.clock()
        self._plan = plan
        self._waiting_since = {s.node_id: now for s in plan.stages} if plan else {}
        self._received = {}

    def restart_clocks(self) -> None:
        """Every stage of our plan that does not serve it has its full deadline from now (this node
        fetches its own layers: its peers plan it only once it holds them)."""
        now = self.clock()
        self._waiting_since = {node: now for node in self._waiting_since}
        if self._plan is not None:
            self._waiting_since.update({s.node_id: now for s in self._plan.stages})

    def overdue(self, announced: Mapping[str, Announced]) -> list[str]:
        """Stages of our plan past their deadline (and clears the record of those that serve it)."""
        plan, now = self._plan, self.clock()
        if plan is None:
            return []
        self._restart_clocks_if_weights_move(plan, announced, now)
        late = []
        for stage in plan.stages:
            node = stage.node_id
            if node == self.own_id:
                continue
            said = announced.get(node, Announced())
            if said.serving == plan.plan_id:
                self._records.pop(node, None)
                self._waiting_since.pop(node, None)
                continue
            since = self._waiting_since.setdefault(node, now)
            if now - since >= self._wait(said, plan):
                late.append(node)
        return late

    def _restart_clocks_if_weights_move(self, plan: Plan, announced: Mapping[str, Announced], now: float) -> None:
        received = {s.node_id: announced.get(s.node_id, Announced()).received for s in plan.stages}
        moved = any(n > self._received.get(node, n) for node, n in received.items())
        self._received = received
        if moved:
            for stage in plan.stages:
                if announced.get(stage.node_id, Announced()).loading == plan.plan_id:
                    self._waiting_since[stage.node_id] = now

    def _wait(self, said: Announced, plan: Plan) -> float:
        return self.loading_s if said.loading == plan.plan_id else self.short_s

    def leave_out(self, nodes: list[str]) -> None:
        now = self.clock()
        for node in nodes:
            record = self._records.setdefault(node, _Record())
            record.strikes += 1
            out_s = min(self.first_out_s * 2 ** (record.strikes - 1), self.max_out_s)
            record.out_until = now + out_s
            log.warning("node %s did not serve plan %s in time: left out of the plans for %.0f s", node,
                        self._plan.plan_id if self._plan else None, out_s)

    def take_back(self, node: str) -> bool:
        """End `node`'s time out now (it announces the plan we would make with it in); False if it is not
        out, or was taken back early less than a first time out ago without serving our plan since."""
        record, now = self._records.get(node), self.clock()
        if record is None or record.out_until <= now or now - record.taken_back_at < self.first_out_s:
            return False
        record.out_until, record.taken_back_at = now, now
        log.info("node %s announces the plan we would make with it: taken back before its time out ends", node)
        return True

    def left_out(self) -> set[str]:
        now = self.clock()
        return {node for node, r in self._records.items() if r.out_until > now and node != self.own_id}

    def next_check(self, announced: Mapping[str, Announced]) -> float | None:
        """When something may change: the next deadline of a stage that does not serve our plan yet, or
        the end of a node's time out (monotonic time); None: nothing pending."""
        now, times = self.clock(), []
        plan = self._plan
        if plan is not None:
            for stage in plan.stages:
                said = announced.get(stage.node_id, Announced())
                if stage.node_id != self.own_id and said.serving != plan.plan_id:
                    times.append(self._waiting_since.get(stage.node_id, now) + self._wait(said, plan))
        times += [r.out_until for r in self._records.values() if r.out_until > now]
        return min(times) if times else None
