"""`balanced`: minimize the pipeline's slowest stage, within memory caps.

Search space: every subset of the nodes, in every order. That is affordable
because stage times do not depend on position, only memory does (first and
last stages carry extra bytes). So a plan is fully described by which node
is first, which is last, and how many layers each node runs; the stage order
is then first, the middles in canonical order, last.

Objective, lexicographic:
  1. the bottleneck (slowest stage time), exact minimum;
  2. closeness to the speed-proportional split: sum over nodes that can hold
     a layer of |layers - n * (1/speed) / sum(1/speed)|. Many splits share
     the optimal bottleneck; this picks the even-handed one (and keeps every
     node within a layer of its ideal share when memory does not bind);
  3. total time, sum of stage times incl. hops (one token's latency), which
     prefers fewer hops and faster nodes;
  4. walking nodes in canonical order (speed, -memory, hop, id): prefer the
     role ALONE < FIRST < MIDDLE < LAST < IDLE, then more layers.
With equal speeds and no binding memory that gives an even split, remainder
layers on the earliest stages.

Two phases: binary search over candidate stage times for the least feasible
bottleneck (a greedy capacity check), then a dynamic program over nodes x
layers placed x (first taken, last taken) for objectives 2-4 under it.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from .costs import Clock, max_layers_in_memory
from .model import ModelSpec, NodeCapacity
from .roles import Role, pipeline_order

PLACING_ROLES = (Role.ALONE, Role.FIRST, Role.MIDDLE, Role.LAST)


def fastest_first(node: NodeCapacity) -> tuple:
    """Fastest first, then most memory, cheapest hop out, node id: every node sorts the same view alike."""
    return (node.seconds_per_layer, -node.memory_bytes, node.hop_latency_s, node.node_id)


def balanced_split(
    model: ModelSpec, nodes: Sequence[NodeCapacity], clock: Clock
) -> Optional[list[tuple[str, int]]]:
    """(node_id, n_layers) in stage order, or None if the nodes cannot hold the model."""
    order = sorted(nodes, key=fastest_first)
    caps = _MemoryCaps(model, order)
    budget = _least_bottleneck(model, order, clock, caps)
    if budget is None:
        return None
    return pipeline_order(_best_assignment(model, order, clock, budget, caps))


class _MemoryCaps:
    """Most layers each node can hold in each role, by memory alone (computed once per split: the
    searches below ask for them once per node, role and candidate budget)."""

    def __init__(self, model: ModelSpec, order: Sequence[NodeCapacity]):
        self._caps = {(node.node_id, role): min(max_layers_in_memory(model, node, role.is_first, role.is_last),
                                                model.n_layers)
                      for node in order for role in PLACING_ROLES}

    def of(self, node: NodeCapacity, role: Role) -> int:
        return self._caps[node.node_id, role]


def _cap(node: NodeCapacity, role: Role, clock: Clock, budget: Optional[int], caps: _MemoryCaps) -> int:
    """Most layers `node` can take in `role` without breaking memory or the time budget."""
    cap = caps.of(node, role)
    if budget is not None:
        cap = min(cap, clock.max_layers_within(node.node_id, budget, alone=role is Role.ALONE))
    return cap


def _feasible(model: ModelSpec, order: Sequence[NodeCapacity], clock: Clock, budget: Optional[int],
              caps: _MemoryCaps) -> bool:
    """Can every stage finish within `budget` ticks (None: no time limit)?"""
    n = model.n_layers
    if any(_cap(node, Role.ALONE, clock, budget, caps) >= n for node in order):
        return True
    if n < 2:  # a first and a last stage take a layer each
        return False
    middle = [max(_cap(node, Role.MIDDLE, clock, budget, caps), 0) for node in order]
    first = [_cap(node, Role.FIRST, clock, budget, caps) for node in order]
    last = [_cap(node, Role.LAST, clock, budget, caps) for node in order]
    total_middle = sum(middle)
    for f in range(len(order)):
        if first[f] < 1:
            continue
        for g in range(len(order)):
            if g == f or last[g] < 1:
                continue
            if total_middle - middle[f] - middle[g] + first[f] + last[g] >= n:
                return True
    return False


def _least_bottleneck(model: ModelSpec, order: Sequence[NodeCapacity], clock: Clock,
                      caps: _MemoryCaps) -> Optional[int]:
    if not _feasible(model, order, clock, None, caps):
        return None
    # The optimum is the time of some stage: some node running some layer count.
    candidates = sorted(
        {
            clock.stage_ticks(node.node_id, x, alone=alone)
            for node in order
            for x in range(1, model.n_layers + 1)
            for alone in (False, True)
        }
    )
    lo, hi = 0, len(candidates) - 1  # candidates[hi] covers every stage, so it is feasible
    while lo < hi:
        mid = (lo + hi) // 2
        if _feasible(model, order, clock, candidates[mid], caps):
            hi = mid
        else:
            lo = mid + 1
    return candidates[lo]


State = tuple[int, bool, bool]  # layers placed so far, first taken, last taken
# (role, layers, stage ticks, takes the first place, takes the last, alone): a role's flags read once,
# not once per state of the search below.
Option = tuple[Role, int, int, bool, bool, bool]


def _options(model: ModelSpec, node: NodeCapacity, clock: Clock, budget: int, caps: _MemoryCaps) -> list[Option]:
    """Every (role, layers, stage ticks, ...) the node may take within memory and the budget."""
    options: list[Option] = [(Role.IDLE, 0, 0, False, False, False)]
    for role in PLACING_ROLES:
        alone = role is Role.ALONE
        for x in range(1, _cap(node, role, clock, budget, caps) + 1):
            if not alone or x == model.n_layers:
                options.append((role, x, clock.stage_ticks(node.node_id, x, alone=alone),
                                role.is_first, role.is_last, alone))
    return options


def _best_assignment(
    model: ModelSpec, order: Sequence[NodeCapacity], clock: Clock, budget: int, caps: _MemoryCaps
) -> list[tuple[str, Role, int]]:
    n = model.n_layers
    options = [_options(model, node, clock, budget, caps) for node in order]

    # Ideal share of node i is n * w[i] / w_sum, w[i] proportional to 1/speed;
    # scaled by w_sum, its distance from x layers is an exact integer.
    lcm = math.lcm(*(clock.speed_ticks(node.node_id) for node in order))
    w = [lcm // clock.speed_ticks(node.node_id) for node in order]
    w_sum = sum(w)

    # Backward DP: value[state] = (deviation, total) for the remaining nodes.
    value: dict[State, tuple[int, int]] = {(n, True, True): (0, 0)}
    choice: list[dict[State, tuple[Role, int]]] = [{} for _ in order]
    for i in reversed(range(len(order))):
        here: dict[State, tuple[int, int]] = {}
        share = n * w[i]
        for placed in range(n + 1):
            for has_first in (False, True):
                for has_last in (False, True):
                    best = None
                    for role, x, ticks, is_first, is_last, alone in options[i]:
                        if placed + x > n:
                            continue
                        if (is_first and has_first) or (is_last and has_last):
                            continue
                        if alone and placed != 0:
                            continue
                        rest = value.get((placed + x, has_first or is_first, has_last or is_last))
                        if rest is None:
                            continue
                        key = (rest[0] + abs(x * w_sum - share), rest[1] + ticks, role, -x)
                        if best is None or key < best:
                            best = key
                    if best is not None:
                        state = (placed, has_first, has_last)
                        here[state] = (best[0], best[1])
                        choice[i][state] = (best[2], -best[3])
        value = here

    assignment = []
    state: State = (0, False, False)
    for i, node in enumerate(order):
        role, x = choice[i][state]
        assignment.append((node.node_id, role, x))
        state = (state[0] + x, state[1] or role.is_first, state[2] or role.is_last)
    return assignment
