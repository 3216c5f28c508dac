"""Quantized weights: what a shard's weights run as, and turning them into floats.

mlx-lm quantizes Linear, Embedding and the experts' SwitchLinear modules
(`nn.QuantizedLinear`, `nn.QuantizedEmbedding`, `QuantizedSwitchLinear`); a
mixed-precision model gives each module its own bits and group size.
"""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)


def _holds_weights(m: nn.Module) -> bool:
    return isinstance(m.get("weight"), mx.array)


def quantized_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Quantized modules that hold weights (stripped ones of other shards do not)."""
    return [(path, m) for path, m in model.named_modules() if isinstance(m, QUANTIZED) and _holds_weights(m)]


def weights_run_as(model: nn.Module) -> str:
    """E.g. "float32", "4-bit affine (group 64) + float32", "4/8-bit affine, mixed (group 32) + bfloat16"."""
    quantized = quantized_modules(model)
    paths = {f"{path}." if path else "" for path, _ in quantized}
    floats = Counter()
    for name, v in tree_flatten(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating) and name.rsplit(".", 1)[0] + "." not in paths:
            floats[str(v.dtype).removeprefix("mlx.core.")] += v.nbytes
    float_part = "/".join(sorted(floats, key=floats.get, reverse=True)) or "no floats"
    if not quantized:
        return float_part
    bits = sorted({m.bits for _, m in quantized})
    groups = sorted({m.group_size for _, m in quantized})
    modes = sorted({getattr(m, "mode", "affine") for _, m in quantized})
    grouping = f"group {groups[0]}" if len(groups) == 1 else "mixed groups"
    kind = f"{'/'.join(map(str, bits))}-bit {'/'.join(modes)}" + (", mixed" if len(bits) > 1 else "")
    return f"{kind} ({grouping}) + {float_part}"


def dequantize(model: nn.Module, dtype: mx.Dtype) -> None:
    """Replace every quantized module holding weights by its float equivalent in `dtype`."""
    replaced = []
    for path, m in quantized_modules(model):
        weight = mx.dequantize(m.weight, m.scales, m.get("biases"), m.group_size, m.bits,
                               getattr(m, "mode", "affine")).astype(dtype)
        bias = "bias" in m
        if isinstance(m, nn.QuantizedLinear):
            f = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
        elif isinstance(m, nn.QuantizedEmbedding):
            f = nn.Embedding(weight.shape[0], weight.shape[1])
        else:
            f = SwitchLinear(weight.shape[2], weight.shape[1], weight.shape[0], bias=bias)
        f.weight = weight
        if bias:
            f.bias = m.bias.astype(dtype)
        replaced.append((path, f))
    if replaced:
        model.update_modules(tree_unflatten(replaced))


def cast_floats(model: nn.Module, dtype: mx.Dtype, scales: bool = False) -> None:
    """Cast floating weights to `dtype`. Packed quantized weights stay as they are, and so do their
    scales and biases unless `scales`: casting them gained nothing measurable on a CPU and costs
    memory (benchmarks/cpu_quantized.py)."""
    packed = set() if scales else {f"{path}." for path, m in model.named_modules() if isinstance(m, QUANTIZED)}
    cast = [(name, v.astype(dtype)) for name, v in tree_flatten(model.parameters())
            if mx.issubdtype(v.dtype, mx.floating) and v.dtype != dtype
            and name.rsplit(".", 1)[0] + "." not in packed]
    if cast:
        model.load_weights(cast, strict=False)
