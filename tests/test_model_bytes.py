"""What the planner is told a model weighs equals what the shards then hold.

Per layer, in the dtype the node runs (quantized kept or dequantized), and the
cache each layer keeps per position: all of it, a sliding window, or a state
that does not grow with the context.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from model_zoo import build_random_model
from model_zoo_configs import WINDOW

from swarm.engine.model_bytes import LayerCache, measure_model_bytes
from swarm.engine.shard import load_shard

CASES = [("llama", None, False), ("deepseek_v3", None, False), ("qwen3_next", None, False),
         ("llama", "4bit", False), ("llama", "4bit", True), ("qwen3_moe", "mixed", True), ("gpt_oss", "8bit", False)]


@pytest.mark.parametrize("family, quantize, dequantize", CASES)
def test_planned_bytes_are_what_each_stage_holds(tmp_path, family, quantize, dequantize):
    path = build_random_model(tmp_path / "m", family, quantize=quantize, seed=1)
    sizes = measure_model_bytes(path, mx.float32, dequantize)
    for start, end in [(0, 2), (2, 4), (4, 6)]:  # first, middle, last
        shard = load_shard(path, start, end, mx.float32, dequantize_layers=dequantize)
        planned = (sum(sizes.per_layer[start:end]) + (sizes.embedding if start == 0 else 0)
                   + (sizes.head if end == 6 else 0))
        assert shard.weight_bytes() == planned, (start, end)


def test_cache_reserves_follow_each_layer_kind(tmp_path):
    gpt_oss = measure_model_bytes(build_random_model(tmp_path / "g", "gpt_oss"), mx.float32)
    # sliding layers keep at most their window, full ones the whole context
    assert [c.window for c in gpt_oss.caches] == [WINDOW, None] * 3
    full, sliding = gpt_oss.caches[1], gpt_oss.caches[0]
    assert full.per_token == sliding.per_token == 2 * 2 * 16 * 4  # K and V, 2 heads of 16, float32
    assert full.reserve(4096) == 4096 * full.per_token and sliding.reserve(4096) == WINDOW * sliding.per_token

    mamba = measure_model_bytes(build_random_model(tmp_path / "m", "mamba"), mx.float32)
    assert all(c.per_token == 0 and c.fixed > 0 for c in mamba.caches)  # a state, whatever the context
    assert mamba.kv_reserve(10) == mamba.kv_reserve(100_000)

    nemotron = measure_model_bytes(build_random_model(tmp_path / "n", "nemotron_h"), mx.float32)
    kinds = ["M", "*", "-", "M", "*", "-"]  # mamba, attention, MLP (no cache)
    for kind, cache in zip(kinds, nemotron.caches):
        assert (cache.fixed > 0, cache.per_token > 0) == (kind == "M", kind == "*"), (kind, cache)
    assert nemotron.caches[2] == LayerCache()


def test_a_shard_says_what_its_weights_run_as(tmp_path):
    mixed = build_random_model(tmp_path / "mixed", "qwen3", quantize="mixed")
    assert load_shard(mixed, 0, 3, mx.float32).weights_run_as == "4/8-bit affine, mixed (group 32) + float32"
    assert load_shard(mixed, 0, 3, mx.float32, dequantize_layers=True).weights_run_as == "float32"
    plain = build_random_model(tmp_path / "plain", "llama")
    assert load_shard(plain, 2, 4, mx.float16).weights_run_as == "float16"
