"""Attention for one new position of several requests, each with its own KV cache.

The four projections (q, k, v, o: a quarter of a block's weights) and RoPE run once
for all rows; only the cache update and the attention itself run row by row,
because each request's cache holds a different number of positions. This is
the attention of mlx-lm's llama, qwen2 and qwen3 families written for that
case (unrolled_decode.py uses it for those families only).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache


def batched_attention(attn: nn.Module, x: mx.array, caches: list[KVCache]) -> mx.array:
    """x: (B, 1, D), already normalised; row b attends over caches[b]. Returns (B, 1, D).

    `attn` is the Attention of mlx-lm's llama, qwen2 or qwen3 (qwen3 adds q_norm / k_norm)."""
    B, L, _ = x.shape
    queries = attn.q_proj(x).reshape(B, L, attn.n_heads, -1)
    keys = attn.k_proj(x).reshape(B, L, attn.n_kv_heads, -1)
    values = attn.v_proj(x).reshape(B, L, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    if hasattr(attn, "q_norm"):
        queries, keys = attn.q_norm(queries), attn.k_norm(keys)
    queries, keys = queries.transpose(0, 2, 1, 3), keys.transpose(0, 2, 1, 3)
    if type(attn.rope) is nn.RoPE:
        # One rotation for all rows at their own positions: MLX's rope takes an offset per row,
        # bit for bit what it gives row by row (other rope classes of mlx-lm need an int offset).
        offsets = mx.array([c.offset for c in caches])
        queries, keys = attn.rope(queries, offset=offsets), attn.rope(keys, offset=offsets)
    else:
        queries = mx.concatenate([attn.rope(queries[b:b + 1], offset=c.offset) for b, c in enumerate(caches)])
        keys = mx.concatenate([attn.rope(keys[b:b + 1], offset=c.offset) for b, c in enumerate(caches)])
    rows = []
    for b, cache in enumerate(caches):
        k, v = cache.update_and_fetch(keys[b:b + 1], values[b:b + 1])
        rows.append(scaled_dot_product_attention(queries[b:b + 1], k, v, cache=cache, scale=attn.scale, mask=None))
    out = mx.concatenate(rows, axis=0).transpose(0, 2, 1, 3).reshape(B, L, -1)
    return attn.o_proj(out)
