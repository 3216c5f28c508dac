"""A node outlines its model once (the dry run of its forward, engine/model_outline.py), at the check
before serving, and hands that outline to everything that builds the model after: the byte count,
the speed probe, each load of its layers."""

from __future__ import annotations

import mlx.core as mx
from model_zoo import build_random_model

from swarm.engine import model_bytes, model_outline, shard
from swarm.engine.model_bytes import measure_model_bytes
from swarm.engine.shard import check_splittable, load_shard
from swarm.engine.speed_probe import measure_speed


def test_the_model_is_outlined_once_at_start(tmp_path, monkeypatch):
    path = build_random_model(tmp_path / "m", "llama", seed=3)
    families = []

    def counted(model, family):
        families.append(family)
        return model_outline.outline(model, family)

    monkeypatch.setattr(shard, "outline", counted)
    monkeypatch.setattr(model_bytes, "outline", counted)
    outlined = check_splittable(path)
    sizes = measure_model_bytes(path, mx.float32, outlined=outlined)
    assert measure_speed(path, len(sizes.per_layer), mx.float32, outlined=outlined) > 0
    held = load_shard(path, 0, 2, mx.float32, outlined=outlined)
    assert families == ["llama"] and outlined.family == "llama" and held.family == "llama"
    load_shard(path, 0, 2, mx.float32)  # without one, a load outlines the model itself
    assert len(families) == 2
