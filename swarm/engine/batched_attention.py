"""Attention for one new position of several requests, each with its own KV cache.

The four projections (q, k, v, o: a quarter of a block's weights) run once for
all rows; only RoPE, the cache update and the attention itself run row by row,
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
    rows = []
    for b, cache in enumerate(caches):
        q = attn.rope(queries[b:b + 1], offset=cache.offset)
        k, v = cache.update_and_fetch(attn.rope(keys[b:b + 1], offset=cache.offset), values[b:b + 1])
        rows.append(scaled_dot_product_attention(q, k, v, cache=cache, scale=attn.scale, mask=None))
    out = mx.concatenate(rows, axis=0).transpose(0, 2, 1, 3).reshape(B, L, -1)
    return attn.o_proj(out)
