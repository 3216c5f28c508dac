"""The partitioner's value types: what goes in (model, nodes) and what comes out (plan)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """Memory shape of a model, in bytes.

    `head_bytes` is everything the last stage adds after the layers (final
    norm + LM head). With tied embeddings the last stage still needs its own
    copy of the matrix, so pass head_bytes = norm + embedding bytes.
    """

    n_layers: int
    bytes_per_layer: int
    embedding_bytes: int = 0
    head_bytes: int = 0
    kv_bytes_per_token_per_layer: int = 0
    context_tokens: int = 0

    @property
    def layer_bytes(self) -> int:
        """Weights of one layer plus the KV cache reserved for it."""
        return self.bytes_per_layer + self.kv_bytes_per_token_per_layer * self.context_tokens

    def stage_bytes(self, n_layers: int, first: bool, last: bool) -> int:
        return (
            n_layers * self.layer_bytes
            + (self.embedding_bytes if first else 0)
            + (self.head_bytes if last else 0)
        )

    @property
    def total_bytes(self) -> int:
        return self.stage_bytes(self.n_layers, first=True, last=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_layers": self.n_layers,
            "bytes_per_layer": self.bytes_per_layer,
            "embedding_bytes": self.embedding_bytes,
            "head_bytes": self.head_bytes,
            "kv_bytes_per_token_per_layer": self.kv_bytes_per_token_per_layer,
            "context_tokens": self.context_tokens,
        }


@dataclass(frozen=True)
class NodeCapacity:
    """What one node offers: memory for the model and its measured speed.

    `hop_latency_s` is the cost of sending activations out of this node to the
    next stage (for the last stage: the sampled token back to the first).
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
