"""Exact time and memory arithmetic shared by the strategies.

Times are compared exactly: every float is a dyadic rational, so scaling all
speeds and latencies by one power of two turns them into Python ints. That
keeps tie-breaks free of rounding noise, so every node gets the same plan.

Timing rule: a stage costs n_layers * seconds_per_layer, plus the node's
hop_latency_s when the pipeline has more than one stage (a lone node sends
nothing over the network).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterable

from .model import ModelSpec, NodeCapacity


class Clock:
    """Integer 'ticks' for node speeds and hop latencies, exact for floats."""

    def __init__(self, nodes: Iterable[NodeCapacity]):
        nodes = list(nodes)
        exact = {
            n.node_id: (Fraction(n.seconds_per_layer), Fraction(n.hop_latency_s)) for n in nodes
        }
        self.scale = max(
            (f.denominator for pair in exact.values() for f in pair), default=1
        )
        self._speed = {k: int(s * self.scale) for k, (s, _) in exact.items()}
        self._hop = {k: int(h * self.scale) for k, (_, h) in exact.items()}

    def speed_ticks(self, node_id: str) -> int:
        return self._speed[node_id]

    def stage_ticks(self, node_id: str, n_layers: int, alone: bool = False) -> int:
        hop = 0 if alone else self._hop[node_id]
        return n_layers * self._speed[node_id] + hop

    def max_layers_within(self, node_id: str, budget_ticks: int, alone: bool = False) -> int:
        """Most layers this node can run without its stage exceeding the budget."""
        room = budget_ticks - (0 if alone else self._hop[node_id])
        return room // self._speed[node_id] if room >= 0 else 0

    def seconds(self, ticks: int) -> float:
        return float(Fraction(ticks, self.scale))


def max_layers_in_memory(model: ModelSpec, node: NodeCapacity, first: bool, last: bool) -> int:
    """Most layers the node can hold in this position, wherever they lie in the model
    (the heaviest run of that many layers must fit); -1 if not even the extras fit."""
    if model.stage_bytes(0, first, last) > node.memory_bytes:
        return -1
    lo, hi = 0, model.n_layers  # stage_bytes grows with the layer count: binary search
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if model.stage_bytes(mid, first, last) <= node.memory_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def can_hold_one_layer(model: ModelSpec, node: NodeCapacity) -> bool:
    return max_layers_in_memory(model, node, first=False, last=False) >= 1
