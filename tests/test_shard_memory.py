"""A shard holds only its own layers' weights (plus embedding / norm+head at the ends)."""

from __future__ import annotations

import gc

import mlx.core as mx

from swarm.engine.shard import load_shard


def resident_after_load(model_dir, start: int, end: int):
    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    shard = load_shard(model_dir, start, end, mx.float32)
    return shard, mx.get_active_memory() - before


def test_resident_bytes_follow_layers(default_model):
    path, n = default_model.path, default_model.n_layers
    full, full_bytes = resident_after_load(path, 0, n)
    inner = full.model.model  # SmolLM2 is a llama: embed_tokens, layers, norm
    embed_bytes = inner.embed_tokens.weight.nbytes
    per_layer = (full.weight_bytes() - embed_bytes - inner.norm.weight.nbytes) / n
    del full
    for start, end in [(10, 13), (4, 20), (0, 5), (25, 30)]:
        shard, resident = resident_after_load(path, start, end)
        expected = (end - start) * per_layer
        if start == 0 or end == n:  # the first stage embeds, the last uses the tied embedding as head
            expected += embed_bytes
        assert abs(shard.weight_bytes() - expected) <= 4096, (start, end)
        # What MLX actually holds in memory, not just what the module tree says.
        assert abs(resident - expected) < 0.02 * full_bytes, (start, end, resident, expected)
        del shard
    # A middle shard of 3 layers is a small fraction of the whole model.
    shard, resident = resident_after_load(path, 10, 13)
    assert resident < 0.12 * full_bytes
