"""Batched decode as an unrolled block loop, only for families a test proves it exact for.

For llama, qwen2 and qwen3 without sliding windows the model's forward is exactly
embed -> blocks (x + attn(norm(x)); h + mlp(norm(h))) -> norm -> head, so one
decode position of several requests can run as one pass with the attention
projections, the MLP and the head (all of the weights) read once for all rows
(batched_attention.py). Any other family, or any of these with extra parts
(sliding layers), returns None here and its rows run one by one through the
model's own forward: slower, never wrong. tests/test_batch_decode.py proves the
allowed families exact; benchmarks/batch_decode_cost.py measures the
alternative of mlx-lm's batch caches around the model's own forward.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from .batched_attention import batched_attention

PROVEN = {"mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3"}


class UnrolledDecode:
    def __init__(self, shard):
        self.shard = shard

    @classmethod
    def for_shard(cls, shard) -> "UnrolledDecode | None":
        model = shard.model
        if type(model).__module__ not in PROVEN:
            return None
        if any(type(c) is not KVCache for c in make_prompt_cache(model)):
            return None  # sliding-window layers (Ministral-style llama)
        return cls(shard)

    def __call__(self, x: mx.array, caches: list) -> mx.array:
        shard = self.shard
        inner, r = shard.model.model, shard.range
        h = inner.embed_tokens(x) if r.is_first else x
        for i, layer in enumerate(shard.owned_layers):
            h = h + batched_attention(layer.self_attn, layer.input_layernorm(h), [c.owned[i] for c in caches])
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        for c in caches:
            c.advance(1)
        if not r.is_last:
            return h
        head = shard.model.lm_head if "lm_head" in shard.model else inner.embed_tokens.as_linear
        return head(inner.norm(h))[:, -1]
