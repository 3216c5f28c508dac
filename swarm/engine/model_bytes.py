"""How many bytes each part of a model takes once loaded, without loading it.

Each layer's own weights, in the dtype this node will run them as (floats cast
to `dtype`, quantized weights kept packed or dequantized), and each layer's
cache per kind: a full-attention layer keeps every position, a sliding-window
layer at most its window, a linear-attention or state-space layer a state of
fixed size. The cache shapes come from one lazy forward of one token through
the model's own code (nothing evaluated, no weight read), so MLA's compressed
keys or a family's own head sizes need no code of ours. What the first and the
last stage hold besides their layers comes from the dry run (model_outline.py),
exactly as a shard keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import CacheList, make_prompt_cache
from mlx_lm.utils import load_model

from . import families
from .draft_check import can_check_drafts
from .model_outline import BETWEEN, POST, PRE, Outline, outline
from .quantized import QUANTIZED


def loaded_bytes(module: nn.Module) -> int:
    """The bytes a loaded (evaluated) module's parameters hold."""
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


@dataclass(frozen=True)
class LayerCache:
    per_token: int = 0  # bytes per cached position
    window: int | None = None  # most positions kept; None: all of them
    fixed: int = 0  # bytes that do not grow with the context (a recurrent state)

    def reserve(self, context_tokens: int) -> int:
        kept = context_tokens if self.window is None else min(self.window, context_tokens)
        return self.fixed + self.per_token * kept


@dataclass(frozen=True)
class ModelBytes:
    per_layer: tuple[int, ...]
    embedding: int  # what the first stage holds besides its layers
    head: int  # what the last stage holds besides its layers (the embedding again when tied)
    caches: tuple[LayerCache, ...]
    activation: int = 0  # what one position's hidden state weighs between two stages (0: not known)
    checks_drafts: bool = False  # its caches can drop unaccepted draft positions (draft_check.can_check_drafts)

    @property
    def kv_per_token_per_layer(self) -> int:
        return max((c.per_token for c in self.caches), default=0)

    def kv_reserve(self, context_tokens: int) -> tuple[int, ...]:
        return tuple(c.reserve(context_tokens) for c in self.caches)


def _own_bytes(m: nn.Module, dtype: mx.Dtype | None, dequantize: bool) -> dict[str, int]:
    """Bytes of each of the module's own parameters once loaded as this node loads them."""
    out = {}
    for key, v in m.items():
        if not isinstance(v, mx.array) or key.startswith("_"):
            continue
        if isinstance(m, QUANTIZED) and dequantize:
            # the packed weight becomes a float matrix; scales and biases go away
            size = {"weight": v.size * 32 // m.bits * (dtype or mx.float32).size,
                    "bias": v.size * (dtype or v.dtype).size}.get(key, 0)
        elif isinstance(m, QUANTIZED) or dtype is None or not mx.issubdtype(v.dtype, mx.floating):
            size = v.nbytes
        else:
            size = v.size * dtype.size
        out[key] = size
    return out


def _tree_bytes(module: nn.Module, dtype: mx.Dtype | None, dequantize: bool) -> int:
    return sum(sum(_own_bytes(m, dtype, dequantize).values()) for _, m in module.named_modules())


def _cache_shape(cache, positions: int, act_bytes: int) -> LayerCache:
    if isinstance(cache, CacheList):
        parts = [_cache_shape(c, positions, act_bytes) for c in cache.caches]
        windows = [p.window for p in parts if p.per_token]
        return LayerCache(sum(p.per_token for p in parts), max(windows) if windows and None not in windows else None,
                          sum(p.fixed for p in parts))
    if hasattr(cache, "offset"):
        window = getattr(cache, "max_size", None) or getattr(cache, "chunk_size", None)
        keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
        if isinstance(keys, mx.array) and isinstance(values, mx.array) and keys.ndim == values.ndim == 4:
            per_token = keys.shape[1] * keys.shape[3] + values.shape[1] * values.shape[3]  # (B, heads, T, dim)
        else:
            per_token = sum(a.size for _, a in tree_flatten(cache.state) if isinstance(a, mx.array)) // positions
        return LayerCache(per_token=per_token * act_bytes, window=window)
    return LayerCache(fixed=sum(a.size for _, a in tree_flatten(cache.state) if isinstance(a, mx.array)) * act_bytes)


def _layer_caches(model: nn.Module, slots, act_bytes: int) -> tuple[LayerCache, ...]:
    """Run one position lazily through the model's own code and read its caches' shapes."""
    caches = make_prompt_cache(model)
    try:
        model(mx.zeros((1, 1), mx.int32), cache=caches)  # builds the graph only; nothing is evaluated
    except Exception:
        return tuple(LayerCache() for _ in slots)
    shapes = [_cache_shape(c, 1, act_bytes) for c in caches]
    out = []
    for layer_slots in slots:
        parts = [shapes[i] for i in layer_slots]
        windows = [p.window for p in parts if p.per_token]
        out.append(LayerCache(sum(p.per_token for p in parts),
                              max(windows) if windows and None not in windows else None, sum(p.fixed for p in parts)))
    return tuple(out)


def model_float_dtype(model) -> mx.Dtype:
    """The dtype of the model's own floating weights (the first found; a quantized model's scales'),
    which its activations take when the node keeps the weights as stored."""
    for _, v in tree_flatten(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            return v.dtype
    return mx.float32


def measure_model_bytes(model_dir: Path, dtype: mx.Dtype | None, dequantize: bool = False,
                        outlined: Outline | None = None) -> ModelBytes:
    """`outlined`: the model's outline (engine/shard.py, check_splittable), else it is outlined here."""
    model, _ = load_model(Path(model_dir), lazy=True)  # lazy: shapes only, nothing read
    outlined = outlined or outline(model, families.family_of(model))
    layers = list(model.layers)
    per_layer = tuple(_tree_bytes(layer, dtype, dequantize) for layer in layers)
    inside = {id(m) for layer in layers for _, m in layer.named_modules()}
    outside: dict[str, int] = {}
    for path, m in model.named_modules():
        if id(m) not in inside:
            prefix = f"{path}." if path else ""
            outside.update({prefix + key: size for key, size in _own_bytes(m, dtype, dequantize).items()})
    embedding = sum(b for p, b in outside.items() if outlined.phases(p) & {PRE, BETWEEN})
    head = sum(b for p, b in outside.items() if outlined.phases(p) & {POST, BETWEEN})
    act_bytes = (dtype or model_float_dtype(model)).size  # the caches hold what the layers compute in
    return ModelBytes(per_layer, embedding, head, _layer_caches(model, outlined.cache_slots, act_bytes),
                      _hidden_size(model) * act_bytes, can_check_drafts(make_prompt_cache(model)))


def _hidden_size(model: nn.Module) -> int:
    """The width of the hidden state a stage hands on, from the model's arguments (0: not known)."""
    args = getattr(model, "args", None)
    for source in (args, getattr(args, "text_config", None)):
        for name in ("hidden_size", "d_model", "n_embd", "dim"):
            value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
            if isinstance(value, int) and value > 0:
                return value
    return 0
