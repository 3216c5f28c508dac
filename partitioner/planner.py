"""make_plan: a swarm view in, a pipeline plan out. Pure and deterministic."""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping, Optional, Sequence

from .balanced import balanced_split
from .by_memory import memory_split
from .costs import Clock, can_hold_one_layer
from .errors import InsufficientMemoryError
from .links import HopCosts, LinkMap, validate_links
from .model import IdleNode, ModelSpec, NodeCapacity, Plan, Stage
from .plan_id import plan_id
from .stage_order import MIN_GAIN_S, TripCosts, best_order
from .validation import validate

Split = Optional[list[tuple[str, int]]]

STRATEGIES: dict[str, Callable[[ModelSpec, Sequence[NodeCapacity], Clock], Split]] = {
    "balanced": balanced_split,
    "memory": lambda model, nodes, clock: memory_split(model, nodes),
}

UNUSED_REASON = {
    "balanced": "not needed: faster without it",
    "memory": "not needed: its memory share rounds to zero layers",
}


LINKS_REASON = "left out: its links cost a token more than its layers take"


def make_plan(model: ModelSpec, nodes: Sequence[NodeCapacity], strategy: str = "balanced",
              links: LinkMap | None = None) -> Plan:
    """Split the model's layers over the nodes.

    `links` are the measured links between nodes, keyed (from, to) (links.py); with links that
    differ, stages are ordered for the shortest trip and a node whose links cost a token more
    than its layers take is left out (stage_order.py). Without them, or with equal ones, the
    plan is the same as with none.

    Raises ValueError on malformed input or an unknown strategy, and
    InsufficientMemoryError when no split fits the swarm's memory.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {sorted(STRATEGIES)}")
    validate(model, nodes)
    validate_links(links or {})
    clock = Clock(nodes)

    usable = [node for node in nodes if can_hold_one_layer(model, node)]
    split = STRATEGIES[strategy](model, usable, clock) if usable else None
    if split is None:
        raise _insufficient(model, nodes)
    hops = HopCosts([n.node_id for n in usable], links or {})
    left_out: dict[str, str] = {}
    if hops.measured and not hops.uniform:
        split, left_out = _link_aware(model, usable, clock, strategy, hops, split)

    stages, start = [], 0
    for node_id, n_layers in split:
        stages.append(Stage(node_id, start, start + n_layers))
        start += n_layers

    alone = len(stages) == 1
    bottleneck = max(clock.stage_ticks(s.node_id, s.n_layers, alone=alone) for s in stages)
    return Plan(
        model=model,
        strategy=strategy,
        stages=tuple(stages),
        idle=_idle(model, nodes, {s.node_id for s in stages}, UNUSED_REASON[strategy], left_out),
        bottleneck_s=clock.seconds(bottleneck),
        plan_id=plan_id(model, stages),
    )


def _link_aware(model: ModelSpec, usable: list[NodeCapacity], clock: Clock, strategy: str, hops: HopCosts,
                split: list[tuple[str, int]]) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """Order the split for the shortest trip; leave out, one at a time, the node whose links add
    the most to a token's trip beyond the swarm's typical link, while that is more than its layers
    take (and than MIN_GAIN_S) and the rest still hold the model."""
    costs = TripCosts(model, usable, hops)
    split = best_order(split, costs)
    left_out: dict[str, str] = {}
    needed: set[str] = set()  # the others cannot hold the model without it: it stays in
    kept = list(usable)
    while len(split) > 1:
        candidates = sorted(((extra - costs.compute(node, layers), node) for node, layers, extra
                             in _extra_hops(split, costs) if extra > max(costs.compute(node, layers), MIN_GAIN_S)
                             and node not in needed), reverse=True)
        for _, node in candidates:
            rest = [n for n in kept if n.node_id != node]
            without = STRATEGIES[strategy](model, rest, Clock(rest))
            if without is not None:
                kept, split = rest, best_order(without, costs)
                left_out[node] = LINKS_REASON
                break
            needed.add(node)
        else:
            break
    return split, left_out


def _extra_hops(split: list[tuple[str, int]], costs: TripCosts) -> list[tuple[str, int, float]]:
    """Each stage's hops in and out, less what a typical link would cost in their place."""
    n = len(split)
    out = []
    for i, (node, layers) in enumerate(split):
        before, after = split[i - 1][0], split[(i + 1) % n][0]
        hops_here = costs.hop(before, node, to_entry=i == 0) + costs.hop(node, after, to_entry=i == n - 1)
        typical_here = costs.typical_hop(to_entry=i == 0) + costs.typical_hop(to_entry=i == n - 1)
        out.append((node, layers, hops_here - typical_here))
    return out


def _idle(
    model: ModelSpec, nodes: Sequence[NodeCapacity], used: set[str], unused_reason: str,
    left_out: Mapping[str, str] = MappingProxyType({}),
) -> tuple[IdleNode, ...]:
    idle = []
    for node in sorted(nodes, key=lambda n: n.node_id):
        if node.node_id in used:
            continue
        if node.node_id in left_out:
            reason = left_out[node.node_id]
        elif can_hold_one_layer(model, node):
            reason = unused_reason
        else:
            reason = (
                f"cannot hold one layer: needs {model.layer_bytes:,} bytes, "
                f"has {node.memory_bytes:,}"
            )
        idle.append(IdleNode(node.node_id, reason))
    return tuple(idle)


def _insufficient(model: ModelSpec, nodes: Sequence[NodeCapacity]) -> InsufficientMemoryError:
    needed = model.total_bytes
    available = sum(node.memory_bytes for node in nodes)
    detail = f"{model.describe_layers()} + embedding {model.embedding_bytes:,} + head {model.head_bytes:,}"
    if available >= needed:
        detail += "; enough in total, but layers cannot be split across nodes to fit"
    return InsufficientMemoryError(needed, available, detail)
