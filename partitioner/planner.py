"""make_plan: a swarm view in, a pipeline plan out. Pure and deterministic."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from .balanced import balanced_split
from .by_memory import memory_split
from .costs import Clock, can_hold_one_layer
from .errors import InsufficientMemoryError
from .model import IdleNode, ModelSpec, NodeCapacity, Plan, Stage
from .plan_id import plan_id
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


def make_plan(model: ModelSpec, nodes: Sequence[NodeCapacity], strategy: str = "balanced") -> Plan:
    """Split the model's layers over the nodes.

    Raises ValueError on malformed input or an unknown strategy, and
    InsufficientMemoryError when no split fits the swarm's memory.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {sorted(STRATEGIES)}")
    validate(model, nodes)
    clock = Clock(nodes)

    usable = [node for node in nodes if can_hold_one_layer(model, node)]
    split = STRATEGIES[strategy](model, usable, clock) if usable else None
    if split is None:
        raise _insufficient(model, nodes)

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
        idle=_idle(model, nodes, {s.node_id for s in stages}, UNUSED_REASON[strategy]),
        bottleneck_s=clock.seconds(bottleneck),
        plan_id=plan_id(model, stages),
    )


def _idle(
    model: ModelSpec, nodes: Sequence[NodeCapacity], used: set[str], unused_reason: str
) -> tuple[IdleNode, ...]:
    idle = []
    for node in sorted(nodes, key=lambda n: n.node_id):
        if node.node_id in used:
            continue
        if can_hold_one_layer(model, node):
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
