"""Change what one module instance does when called, keeping everything else it has.

A shard runs the model's own forward, so the model's code must find every
layer where it expects it, with every attribute it reads (`layer.use_sliding`,
`layer.self_attn.is_local`, ...). Instead of replacing layers, this swaps the
class of one instance for a subclass that wraps `__call__`: weights, names and
attributes stay, and `parameters()` paths stay those of the checkpoint.

Calls come from the model's forward on the MLX thread, one forward at a time.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn

# The names layers of mlx-lm families take their hidden states under, when passed by keyword.
HIDDEN_KEYWORDS = ("x", "h", "hidden_states", "inputs", "hidden")


def hidden_of(args: tuple, kwargs: dict) -> mx.array:
    """The hidden-states argument of a layer call: the first positional, else a known keyword."""
    if args:
        return args[0]
    for key in HIDDEN_KEYWORDS:
        if key in kwargs:
            return kwargs[key]
    raise TypeError(f"layer called without hidden states (keywords: {sorted(kwargs)})")


def with_hidden(args: tuple, kwargs: dict, h: mx.array) -> tuple[tuple, dict]:
    if args:
        return (h, *args[1:]), kwargs
    for key in HIDDEN_KEYWORDS:
        if key in kwargs:
            return args, {**kwargs, key: h}
    raise TypeError(f"layer called without hidden states (keywords: {sorted(kwargs)})")


class LayerHook:
    """What a hooked layer does around its own __call__; subclasses override."""

    def call(self, layer: nn.Module, call: Callable, args: tuple, kwargs: dict) -> Any:
        return call(*args, **kwargs)


class _Hooked:
    """Mixin placed before the original class: routes __call__ through the instance's hook."""

    def __call__(self, *args, **kwargs):
        base_call = super().__call__
        return self._swarm_hook.call(self, base_call, args, kwargs)


_HOOKED_CLASSES: dict[type, type] = {}


def _hooked_class(cls: type) -> type:
    if cls not in _HOOKED_CLASSES:
        _HOOKED_CLASSES[cls] = type(f"Hooked{cls.__name__}", (_Hooked, cls), {"_swarm_base": cls})
    return _HOOKED_CLASSES[cls]


def hook(module: nn.Module, the_hook: LayerHook) -> None:
    """From now on calling `module` goes through `the_hook` (replaces any earlier hook)."""
    unhook(module)
    module.__class__ = _hooked_class(type(module))
    object.__setattr__(module, "_swarm_hook", the_hook)


def unhook(module: nn.Module) -> None:
    base = getattr(type(module), "_swarm_base", None)
    if base is not None:
        module.__class__ = base
        object.__delattr__(module, "_swarm_hook")


def hooked(module: nn.Module) -> LayerHook | None:
    return module.__dict__.get("_swarm_hook")


def strip_arrays(module: nn.Module) -> int:
    """Drop every array `module` and its children hold; returns the bytes dropped.

    The module keeps its children and plain attributes, so a forward can still
    read them; reading a dropped weight fails loudly instead of loading it.
    """
    dropped = 0
    for _, child in module.named_modules():
        for key in [k for k, v in child.items() if isinstance(v, mx.array)]:
            dropped += child[key].nbytes
            del child[key]
    return dropped
