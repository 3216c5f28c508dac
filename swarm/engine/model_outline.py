"""What a model's own forward does around its layers, found by running it once on nothing.

A shard runs the model's forward restricted to its layers, so it must know
which weights outside `model.layers` each position in the pipeline needs: the
embedding (and whatever else runs before the first layer) on the first stage,
the final norm, head and logit scales on the last, and anything read between
layers on every stage. The dry run calls the model with every layer replaced
by a pass-through and records which of the other modules' arrays it reads
before, between and after the layers. Nothing is evaluated, so no weight is
read from disk.

It also checks that the layers form a chain a pipeline can cut anywhere: each
layer called once, in order, each taking the previous layer's output as its
input, no two layers handed the same cache. A family whose layers pass more
than hidden states between them, share keys and values, or run twice, fails
here with the reason, at load, not mid-request. And it notes which entry of
the model's cache list each layer is handed (not always the layer's index:
nemotron_h's MLP layers have no cache, so later layers' caches shift).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import CacheList, KVCache, QuantizedKVCache, make_prompt_cache

from ..models.errors import UnsplittableModel
from .layer_hooks import LayerHook, hidden_of, hook, unhook

PRE, BETWEEN, POST = "pre", "between", "post"
EMBEDDINGS = (nn.Embedding, nn.QuantizedEmbedding)


@dataclass(frozen=True)
class Outline:
    n_layers: int
    # checkpoint parameter paths outside the layers, by when the forward reads them
    reads: dict[str, frozenset[str]]
    embedding_modules: frozenset[str]  # module paths of embeddings read before the first layer
    cache_slots: tuple[tuple[int, ...], ...]  # per layer: the indexes of the cache entries it is handed
    family: str = ""  # the model's family (engine/families.py)
    untrimmable: str = ""  # cache kinds that cannot be trimmed at any length (no drafts then), comma-separated

    def slots_of(self, start: int, end: int) -> list[int]:
        return sorted(i for layer in self.cache_slots[start:end] for i in layer)

    def phases(self, param: str) -> frozenset[str]:
        return self.reads.get(param, frozenset())


@dataclass
class _Recorder:
    phase: str = PRE
    reads: dict[str, set[str]] = field(default_factory=dict)
    calls: list[int] = field(default_factory=list)
    chain_breaks: list[int] = field(default_factory=list)
    last_output: mx.array | None = None
    cache_index: dict[int, int] = field(default_factory=dict)  # id(cache entry) -> its index
    slots: dict[int, tuple[int, ...]] = field(default_factory=dict)  # layer -> cache entries it got


class _Recording:
    """Mixin for the modules outside the layers: logs every array they read."""

    def _swarm_log(self, key, value):
        if isinstance(value, mx.array):
            rec, path = self.__dict__["_swarm_recording"]
            rec.reads.setdefault(f"{path}{key}", set()).add(rec.phase)
        return value

    def __getattr__(self, key):
        return self._swarm_log(key, super().__getattr__(key))

    def __getitem__(self, key):
        return self._swarm_log(key, super().__getitem__(key))

    def get(self, key, default=None):
        value = super().get(key, default)
        return self._swarm_log(key, value) if key in self else value


_RECORDING: dict[type, type] = {}


def _recording_class(cls: type) -> type:
    if cls not in _RECORDING:
        _RECORDING[cls] = type(f"Recording{cls.__name__}", (_Recording, cls), {"_swarm_plain": cls})
    return _RECORDING[cls]


class _DryRunLayer(LayerHook):
    def __init__(self, index: int, n_layers: int, rec: _Recorder):
        self.index, self.n_layers, self.rec = index, n_layers, rec

    def call(self, layer, call, args, kwargs):
        rec = self.rec
        h = hidden_of(args, kwargs)
        if not isinstance(h, mx.array):
            raise TypeError(f"layer {self.index} was given {type(h).__name__} as its hidden states")
        if rec.calls and h is not rec.last_output:
            rec.chain_breaks.append(self.index)
        rec.calls.append(self.index)
        given = [*args[1:], *kwargs.values()]
        rec.slots[self.index] = tuple(rec.cache_index[id(a)] for a in given if id(a) in rec.cache_index)
        rec.phase = BETWEEN
        out = h * 1  # a new array, so the next layer's input can be told apart from other arrays
        rec.last_output = out
        if self.index == self.n_layers - 1:
            rec.phase = POST
        return out


def outline(model: nn.Module, model_type: str) -> Outline:
    """Dry-run `model` (weights may be lazy and stay unread). Raises UnsplittableModel."""
    layers = list(model.layers)
    n = len(layers)
    if n == 0:
        raise UnsplittableModel(f"{model_type}: the model has no layers in model.layers")
    inside = {id(m) for layer in layers for _, m in layer.named_modules()}
    outside = [(path, m) for path, m in model.named_modules() if id(m) not in inside]
    params = {path for path, _ in tree_flatten(model.parameters())}
    rec = _Recorder()
    try:
        for i, layer in enumerate(layers):
            hook(layer, _DryRunLayer(i, n, rec))
        for path, m in outside:
            m.__class__ = _recording_class(type(m))
            object.__setattr__(m, "_swarm_recording", (rec, f"{path}." if path else ""))
        caches = make_prompt_cache(model)
        rec.cache_index = {id(c): i for i, c in enumerate(caches)}
        try:
            model(mx.zeros((1, 2), mx.int32), cache=caches)
        except Exception as e:  # the model's own code, whatever it raises
            raise UnsplittableModel(
                f"{model_type}: its forward does not run when each layer only passes hidden states on "
                f"(its layers exchange more than that): {type(e).__name__}: {e}") from e
    finally:
        for layer in layers:
            unhook(layer)
        for _, m in outside:
            plain = getattr(type(m), "_swarm_plain", None)
            if plain is not None:
                m.__class__ = plain
                object.__delattr__(m, "_swarm_recording")
    _check_chain(rec, n, model_type)
    reads = {p: frozenset(ph) for p, ph in rec.reads.items() if p in params}
    embeddings = frozenset(path for path, m in outside if isinstance(m, EMBEDDINGS)
                           and any(PRE in reads.get(f"{path}.{k}", ()) for k in m))
    untrimmable = ", ".join(sorted({type(c).__name__ for c in _leaves(caches) if not isinstance(c, TRIMMABLE)}))
    return Outline(n, reads, embeddings, tuple(rec.slots.get(i, ()) for i in range(n)), model_type, untrimmable)


# Caches that take positions back at any length (mlx-lm's trim): a step's rejected drafts are trimmed.
# A rotating window cannot once past its size; a recurrent state (ArraysCache) never can.
TRIMMABLE = (KVCache, QuantizedKVCache)


def _leaves(caches: list) -> list:
    return [leaf for c in caches for leaf in (_leaves(c.caches) if isinstance(c, CacheList) else [c])]


def _check_chain(rec: _Recorder, n: int, model_type: str) -> None:
    holders: dict[int, int] = {}
    for layer, slots in sorted(rec.slots.items()):
        for slot in slots:
            if slot in holders:
                raise UnsplittableModel(
                    f"{model_type}: cannot be split into contiguous layer ranges: layers {holders[slot]} and "
                    f"{layer} are handed the same cache (they share keys and values)")
            holders[slot] = layer
    if rec.calls == list(range(n)) and not rec.chain_breaks:
        return
    if len(rec.calls) > n and set(rec.calls) == set(range(n)):
        why = "it runs its layer stack more than once"
    elif set(rec.calls) != set(range(n)):
        missing = sorted(set(range(n)) - set(rec.calls))
        why = f"its forward does not call layers {missing[:8]} of model.layers"
    elif rec.calls != list(range(n)):
        why = "its forward calls its layers out of order"
    else:
        why = (f"layer {rec.chain_breaks[0]} does not take the previous layer's output as its input "
               "(it gets other data computed before the layers)")
    raise UnsplittableModel(f"{model_type}: cannot be split into contiguous layer ranges: {why}")
