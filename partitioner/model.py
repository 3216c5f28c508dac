"""The partitioner's value types: what goes in (model, nodes) and what comes out (plan)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """Memory shape of a model, in bytes.

    `head_bytes` is everything the last stage adds after the layers (final
    norm + LM head). With tied embeddings the last stage still needs its own
    copy of the matrix, so pass head_bytes = norm + embedding bytes.

    Layers may differ: `layer_weight_bytes` gives each layer's own weights
    (DeepSeek V3's dense first layers beside its expert layers, Qwen3-Next's
    two kinds) and `layer_kv_bytes` each layer's cache reserve for
    `context_tokens` (a sliding-window layer keeps at most its window, a
    linear-attention layer a fixed state). Left empty, every layer weighs
    `bytes_per_layer` and reserves `kv_bytes_per_token_per_layer * context_tokens`.

    A stage of k layers is planned with the heaviest k consecutive layers
    (`stage_bytes`), so whichever k it ends up holding fit; `range_bytes` is
    what a given range actually holds.
    """

    n_layers: int
    bytes_per_layer: int = 0
    embedding_bytes: int = 0
    head_bytes: int = 0
    kv_bytes_per_token_per_layer: int = 0
    context_tokens: int = 0
    layer_weight_bytes: tuple[int, ...] = ()
    layer_kv_bytes: tuple[int, ...] = ()
    # What a stage sends the next one per position (hidden size x activation dtype): a hop's payload.
    activation_bytes: int = 0

    @cached_property
    def layer_costs(self) -> tuple[int, ...]:
        """Weights plus cache reserve of each layer."""
        weights = self.layer_weight_bytes or (self.bytes_per_layer,) * self.n_layers
        kv = self.layer_kv_bytes or (self.kv_bytes_per_token_per_layer * self.context_tokens,) * self.n_layers
        return tuple(w + k for w, k in zip(weights, kv))

    @cached_property
    def _prefix(self) -> tuple[int, ...]:
        return (0, *accumulate(self.layer_costs))

    @cached_property
    def _heaviest(self) -> tuple[int, ...]:
        """_heaviest[k]: the most any k consecutive layers weigh."""
        p, n = self._prefix, self.n_layers
        return tuple(max((p[i + k] - p[i] for i in range(n - k + 1)), default=0) for k in range(n + 1))

    @property
    def layer_bytes(self) -> int:
        """The heaviest layer: weights plus the cache reserved for it."""
        return self._heaviest[1] if self.n_layers else 0

    @property
    def uniform(self) -> bool:
        return len(set(self.layer_costs)) <= 1

    def stage_bytes(self, n_layers: int, first: bool, last: bool) -> int:
        """What a stage of `n_layers` layers is planned with, wherever in the model they are."""
        return self._heaviest[n_layers] + (self.embedding_bytes if first else 0) + (self.head_bytes if last else 0)

    def range_bytes(self, start: int, end: int, first: bool, last: bool) -> int:
        """What the layers [start, end) hold, plus the embedding / head of a first / last stage."""
        return (self._prefix[end] - self._prefix[start] + (self.embedding_bytes if first else 0)
                + (self.head_bytes if last else 0))

    @property
    def total_bytes(self) -> int:
        return self.stage_bytes(self.n_layers, first=True, last=True)

    def describe_layers(self) -> str:
        costs = self.layer_costs
        if self.uniform:
            return f"{self.n_layers} layers x {self.layer_bytes:,} bytes incl. KV cache"
        return f"{self.n_layers} layers of {min(costs):,} to {max(costs):,} bytes incl. KV cache"

    def to_dict(self) -> dict[str, Any]:
        out = {
            "n_layers": self.n_layers,
            "bytes_per_layer": self.bytes_per_layer,
            "embedding_bytes": self.embedding_bytes,
            "head_bytes": self.head_bytes,
            "kv_bytes_per_token_per_layer": self.kv_bytes_per_token_per_layer,
            "context_tokens": self.context_tokens,
        }
        if self.layer_weight_bytes:
            out["layer_weight_bytes"] = list(self.layer_weight_bytes)
        if self.layer_kv_bytes:
            out["layer_kv_bytes"] = list(self.layer_kv_bytes)
        if self.activation_bytes:
            out["activation_bytes"] = self.activation_bytes
        return out


@dataclass(frozen=True)
class NodeCapacity:
    """What one node offers: memory for the model and its measured speed.

    `hop_latency_s` is the cost of sending activations out of this node to the
    next stage (for the last stage: the sampled token back to the first), used
    where no link between the nodes was measured (links.py).
    """

    node_id: str
    memory_bytes: int
    seconds_per_layer: float
    hop_latency_s: float = 0.0


@dataclass(frozen=True)
class Stage:
    """Node `node_id` runs layers [start, end)."""

    node_id: str
    start: int
    end: int

    @property
    def n_layers(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class IdleNode:
    node_id: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "reason": self.reason}


@dataclass(frozen=True)
class Plan:
    """A pipeline: stages in order, covering [0, n_layers) contiguously."""

    model: ModelSpec
    strategy: str
    stages: tuple[Stage, ...]
    idle: tuple[IdleNode, ...]
    bottleneck_s: float
    plan_id: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "strategy": self.strategy,
            "model": self.model.to_dict(),
            "stages": [s.to_dict() for s in self.stages],
            "idle": [i.to_dict() for i in self.idle],
            "bottleneck_s": self.bottleneck_s,
        }
