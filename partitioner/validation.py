"""Reject malformed inputs early, with messages that say what is wrong."""

from __future__ import annotations

import math
from typing import Sequence

from .model import ModelSpec, NodeCapacity


def validate(model: ModelSpec, nodes: Sequence[NodeCapacity]) -> None:
    if model.n_layers <= 0:
        raise ValueError(f"model must have a positive number of layers, got {model.n_layers}")
    for field in ("layer_weight_bytes", "layer_kv_bytes"):
        values = getattr(model, field)
        if values and len(values) != model.n_layers:
            raise ValueError(f"{field} must give one value per layer ({model.n_layers}), got {len(values)}")
        if any(v < 0 for v in values):
            raise ValueError(f"{field} must not be negative")
    if model.layer_weight_bytes:
        if max(model.layer_weight_bytes) <= 0:
            raise ValueError("layer_weight_bytes must hold a positive value")
    elif model.bytes_per_layer <= 0:
        raise ValueError(f"bytes_per_layer must be positive, got {model.bytes_per_layer}")
    for field in ("bytes_per_layer", "activation_bytes", "embedding_bytes", "head_bytes", "kv_bytes_per_token_per_layer",
                  "context_tokens"):
        if getattr(model, field) < 0:
            raise ValueError(f"{field} must not be negative, got {getattr(model, field)}")
    if not nodes:
        raise ValueError("need at least one node")

    seen: set[str] = set()
    for node in nodes:
        if node.node_id in seen:
            raise ValueError(f"duplicate node id {node.node_id!r}")
        seen.add(node.node_id)
        if node.memory_bytes < 0:
            raise ValueError(f"node {node.node_id!r}: memory must not be negative, got {node.memory_bytes}")
        speed = node.seconds_per_layer
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"node {node.node_id!r}: seconds_per_layer must be positive and finite, got {speed}")
        hop = node.hop_latency_s
        if not (math.isfinite(hop) and hop >= 0):
            raise ValueError(f"node {node.node_id!r}: hop_latency_s must be >= 0 and finite, got {hop}")
