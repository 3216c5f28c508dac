"""BENCH-ONLY BASELINE: the shard as it was before it ran each model's own forward.

Kept verbatim (minus batched decode) so benchmarks/shard_ab.py can time today's
shard against it in one process. Exact only for the plainest families; never
import it from swarm/.

A shard: the transformer layers [start, end) of an mlx-lm model, and only those.

The first shard also owns the token embedding, the last one the final norm and the
head (the embedding matrix itself when embeddings are tied). Weights outside the
shard are never evaluated, so they are never read from disk into memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.utils import load_model



# A transformer block as llama, qwen2, qwen3 and most mlx-lm families write it:
# h = x + self_attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h))
_BLOCK_PARTS = ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp")


@dataclass(frozen=True)
class LayerRange:
    start: int
    end: int
    n_layers: int

    def __post_init__(self):
        if not 0 <= self.start < self.end <= self.n_layers:
            raise ValueError(f"bad layer range [{self.start}, {self.end}) of {self.n_layers}")

    @property
    def is_first(self) -> bool:
        return self.start == 0

    @property
    def is_last(self) -> bool:
        return self.end == self.n_layers


class Shard(nn.Module):
    def __init__(self, full_model: nn.Module, layers: LayerRange):
        super().__init__()
        inner = getattr(full_model, "model", None)
        if inner is None or not hasattr(inner, "layers"):
            raise ValueError(
                f"model type {getattr(full_model, 'model_type', '?')!r} does not keep "
                "its blocks in model.layers; swarm cannot split it"
            )
        if len(inner.layers) != layers.n_layers:
            raise ValueError(f"model has {len(inner.layers)} layers, range expects {layers.n_layers}")
        self.range = layers
        self.layers = inner.layers[layers.start : layers.end]
        tied = not hasattr(full_model, "lm_head")
        if layers.is_first or (layers.is_last and tied):
            self.embed_tokens = inner.embed_tokens
        if layers.is_last:
            self.norm = inner.norm
            if not tied:
                self.lm_head = full_model.lm_head
        self.tied = tied

    def make_caches(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def __call__(self, x: mx.array, caches: list[KVCache]) -> mx.array:
        """x is token ids (1, L) on the first shard, hidden states (1, L, D) after.

        Returns hidden states, or on the last shard the logits of the final position.
        """
        h = self.embed_tokens(x) if self.range.is_first else x
        mask = create_attention_mask(h, caches[0])
        for layer, cache in zip(self.layers, caches):
            h = layer(h, mask, cache=cache)
        if not self.range.is_last:
            return h
        h = self.norm(h[:, -1:, :])
        head = self.embed_tokens.as_linear if self.tied else self.lm_head
        return head(h)[0, -1]

    def weight_bytes(self) -> int:
        return sum(v.nbytes for _, v in tree_flatten(self.parameters()))


def load_shard(model_dir: Path, start: int, end: int | None, dtype: mx.Dtype | None = None,
               reuse: Shard | None = None) -> Shard:
    """Build the model lazily, keep only this shard's modules, then evaluate them.

    `dtype` casts floating (non-quantized) weights, e.g. to float32 on a CPU backend
    where float16 matmuls are several times slower. `end` None means the last layer.
    Modules that `reuse` (the shard this node held before a re-plan) already has are
    taken over as they are, so a node only reads the layers it newly owns.
    """
    model, config = load_model(Path(model_dir), lazy=True, strict=True)
    n_layers = len(model.model.layers)
    shard = Shard(model, LayerRange(start, n_layers if end is None else end, n_layers))
    del model
    if reuse is not None:
        _take_over(shard, reuse)
    if dtype is not None:
        shard.update(
            _cast_floats(shard.parameters(), dtype, quantized=_quantized_paths(shard))
        )
    mx.eval(shard.parameters())
    shard.eval()
    return shard


def _take_over(shard: Shard, old: Shard) -> None:
    for i in range(max(shard.range.start, old.range.start), min(shard.range.end, old.range.end)):
        shard.layers[i - shard.range.start] = old.layers[i - old.range.start]
    for name in ("embed_tokens", "norm", "lm_head"):
        if name in shard and name in old:
            shard[name] = old[name]


def _quantized_paths(shard: Shard) -> set[str]:
    return {name for name, m in shard.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}


def _cast_floats(params, dtype, quantized: set[str], prefix: str = ""):
    # Quantized modules keep their packed weights, scales and biases as they are.
    if isinstance(params, dict):
        return {k: _cast_floats(v, dtype, quantized, f"{prefix}{k}.") for k, v in params.items()}
    if isinstance(params, list):
        return [_cast_floats(v, dtype, quantized, f"{prefix}{i}.") for i, v in enumerate(params)]
    module_path = prefix.rsplit(".", 2)[0]
    if module_path in quantized or not mx.issubdtype(params.dtype, mx.floating) or params.dtype == dtype:
        return params
    return params.astype(dtype)
