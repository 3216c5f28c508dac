"""How many bytes each part of a model takes once loaded, without loading it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class ModelBytes:
    per_layer: tuple[int, ...]
    embedding: int
    norm: int
    lm_head: int  # 0 with tied embeddings: the last stage then holds the embedding as its head
    kv_per_token_per_layer: int

    @property
    def head(self) -> int:
        """What the last stage holds besides its layers."""
        return self.norm + (self.lm_head or self.embedding)


def measure_model_bytes(model_dir: Path, dtype: mx.Dtype | None) -> ModelBytes:
    model, config = load_model(Path(model_dir), lazy=True)  # lazy: shapes only, nothing read
    quantized = {name for name, m in model.named_modules()
                 if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    n_layers = len(model.model.layers)
    per_layer = [0] * n_layers
    embedding = norm = lm_head = 0
    for name, value in tree_flatten(model.parameters()):
        nbytes = value.nbytes
        if dtype is not None and mx.issubdtype(value.dtype, mx.floating) and name.rsplit(".", 1)[0] not in quantized:
            nbytes = value.size * dtype.size
        if m := _LAYER.match(name):
            per_layer[int(m.group(1))] += nbytes
        elif name.startswith("model.embed_tokens."):
            embedding += nbytes
        elif name.startswith("model.norm."):
            norm += nbytes
        elif name.startswith("lm_head."):
            lm_head += nbytes
    attn = model.model.layers[0].self_attn
    kv_heads = getattr(attn, "n_kv_heads", None) or config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    act_bytes = (dtype or mx.float32).size if dtype is not None else 2 if mx.metal.is_available() else 4
    return ModelBytes(tuple(per_layer), embedding, norm, lm_head, 2 * kv_heads * head_dim * act_bytes)
