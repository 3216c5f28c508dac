"""Prompts of new requests that queue together at a stage share one left-padded pass (ShardRunner.prefill_batch).

The padded pass runs the model's own forward on mlx-lm's BatchKVCache; its rows differ from a
lone prefill in the last bits (padding changes the attention's reduction), so this compares
greedy tokens and hidden states to a tolerance, and checks that each row's caches then decode
exactly like a lone request's caches would (same positions, no padding left in them).
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import CacheMismatch, ShardRunner
from model_zoo import build_random_model

GREEDY = SamplingParams()


@pytest.fixture(scope="module", params=["qwen3", "llama", "qwen2"])
def family_model(request, tmp_path_factory):
    return request.param, build_random_model(tmp_path_factory.mktemp(request.param) / "m", family=request.param,
                                             n_layers=6, hidden=128, heads=4, kv_heads=2, intermediate=256, seed=7)


@pytest.mark.parametrize("bounds", [(0, None), (0, 2), (2, 5), (5, None)])
def test_padded_prompt_pass_equals_each_prompt_alone(family_model, bounds) -> None:
    family, model = family_model
    single, batched = (ShardRunner(load_shard(model, *bounds)) for _ in range(2))
    first, last = bounds[0] == 0, bounds[1] is None
    prompts = [[5, 9, 13, 2, 7, 1, 3, 9], [3, 3], [11, 4, 8, 1, 9, 6, 2, 10, 5, 7, 7, 8]]

    def given(i: int, n: int, at: int) -> mx.array:
        if first:
            return mx.array([prompts[i][at:at + n]])
        return mx.random.normal((1, n, 128), key=mx.random.key(10 * i + at))
    items = [(f"r{i}", given(i, len(p), 0)) for i, p in enumerate(prompts)]
    alone = [single.forward(rid, x, 0) for rid, x in items]
    together = batched.prefill_batch(items, ["", "", ""])
    for a, t in zip(alone, together):
        assert a.shape == t.shape
        assert mx.allclose(a, t, atol=1e-4, rtol=1e-4), f"{family} {bounds}"
    tokens = [int(mx.argmax(a)) if last else 1 for a in alone]
    for step in range(6):  # the caches hold each prompt's positions, no padding
        for runner in (single, batched):
            outs = [runner.forward(f"r{i}", mx.array([[t]]) if first else given(i, 1, len(p) + step),
                                   len(p) + step, GREEDY if last else None)
                    for i, (p, t) in enumerate(zip(prompts, tokens))]
            if runner is single:
                expected = outs
            elif last:
                assert outs == expected, f"{family} {bounds} step {step}"
            else:
                assert all(mx.allclose(o, e, atol=1e-4, rtol=1e-4) for o, e in zip(outs, expected))
        if last:
            tokens = expected
    assert batched.active_requests == 3
    out = batched.prefill_batch([("r0", given(0, 3, 0)), ("big", given(1, 2, 0))], ["", ""])
    assert not isinstance(out[0], Exception) and batched.forward("r0", given(0, 1, 3), 3) is not None, \
        "a prompt again from position 0 starts its request afresh"
    small = ShardRunner(load_shard(model, *bounds), context=4)
    out = small.prefill_batch([("r0", given(0, 8, 0)), ("r1", given(1, 2, 0))], ["", ""])
    assert isinstance(out[0], CacheMismatch) and not isinstance(out[1], Exception)
