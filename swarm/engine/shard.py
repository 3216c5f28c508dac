"""A shard: the layers [start, end) of an mlx-lm model, run by the model's own forward.

The shard keeps the whole model object and restricts it to its range, so the
model's own code does everything it does around the layers: embedding scales,
per-layer masks and caches, extra norms, soft-caps and logit scales. Nothing
of that is re-written here, and a new mlx-lm family works without code of ours.

- Layers outside the range keep their attributes but hold no weights; called,
  they hand their input on.
- A shard that is not first injects the hidden states it received at its first
  layer; the embedding it does not own is a weightless stand-in, so the model's
  own embedding code runs harmlessly (its output is never used).
- A shard that is not last stops right after its last layer (the layer raises
  `StopAfterLayer`): nothing after it is built or evaluated.
- The last shard runs the head on the last position only.
- Weights outside what the shard needs are never evaluated, so never read from
  disk; which of the weights outside the layers a position needs is found by a
  dry run of the model's forward (model_outline.py).

The first shard takes token ids (1, L); later ones hidden states (1, L, D). The
last returns the logits of the final position (vocab,), the others hidden states.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from ..models.errors import ModelFormatError, UnsplittableModel
from . import families
from .input_limits import InputLimits
from .layer_hooks import LayerHook, hidden_of, hook, strip_arrays, with_hidden
from .model_bytes import loaded_bytes
from .model_outline import BETWEEN, POST, PRE, Outline, outline
from .padded_passes import PaddedPasses
from .quantized import cast_floats, dequantize, weights_run_as
from .shard_caches import ShardCaches
from .unrolled_decode import UnrolledDecode

log = logging.getLogger(__name__)


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


class StopAfterLayer(Exception):
    """Raised by a non-last shard's last layer: carries its output out of the model's forward."""

    def __init__(self, hidden: mx.array):
        self.hidden = hidden


class _PassThrough(LayerHook):
    """A layer outside the shard: hands its input on."""

    def call(self, layer, call, args, kwargs):
        return hidden_of(args, kwargs)


class _Edge(LayerHook):
    """The first and/or last layer of a shard."""

    def __init__(self, inject: bool, stop: bool, last_position: bool):
        self.inject, self.stop, self.last_position = inject, stop, last_position
        self.pending: mx.array | None = None  # hidden states to inject at the next call
        self.rows_end: mx.array | None = None  # each row's last real position (a right-padded pass), else the last

    def call(self, layer, call, args, kwargs):
        if self.inject:
            if self.pending is None:
                raise RuntimeError("the shard's first layer ran twice in one forward")
            args, kwargs = with_hidden(args, kwargs, self.pending)
            self.pending = None
        out = call(*args, **kwargs)
        if self.stop:
            raise StopAfterLayer(out)
        if self.last_position and out.shape[1] > 1:  # the head runs on the position whose logits are wanted
            ends = self.rows_end
            out = out[:, -1:, :] if ends is None else mx.take_along_axis(out, ends[:, None, None], axis=1)
        return out


class _WeightlessEmbedding(LayerHook):
    """Stands in for an embedding a later shard does not own: right shape and dtype, no weights."""

    def __init__(self, dims: int, dtype: mx.Dtype):
        self.dims, self.dtype = dims, dtype

    def call(self, layer, call, args, kwargs):
        ids = args[0] if args else next(iter(kwargs.values()))
        return mx.zeros((*ids.shape, self.dims), self.dtype)


def _embedding_shape(m: nn.Module, dtype: mx.Dtype | None) -> tuple[int, mx.Dtype]:
    if isinstance(m, nn.QuantizedEmbedding):
        return m.weight.shape[-1] * 32 // m.bits, m.scales.dtype
    w = m.weight
    return w.shape[-1], dtype if dtype is not None and mx.issubdtype(w.dtype, mx.floating) else w.dtype


class Shard(PaddedPasses, nn.Module):
    def __init__(self, model: nn.Module, layers: LayerRange, outline: Outline, family: str,
                 dtype: mx.Dtype | None = None):
        super().__init__()
        self.model = model
        self.range = layers
        self.family = family
        model_layers = list(model.layers)
        if len(model_layers) != layers.n_layers:
            raise ValueError(f"model has {len(model_layers)} layers, range expects {layers.n_layers}")
        self.hidden_size, self.activation_dtype = None, dtype
        self.vocab_size: int | None = None  # the first shard's embedding rows: token ids must be below
        for i, layer in enumerate(model_layers):
            if not layers.start <= i < layers.end:
                strip_arrays(layer)
                hook(layer, _PassThrough())
        self._strip_outside(outline, dtype)
        args = getattr(model, "args", None)
        if self.hidden_size is None:  # no nn.Embedding before the layers: the config says it
            self.hidden_size = getattr(args, "hidden_size", None)
        if layers.is_first and self.vocab_size is None:
            self.vocab_size = getattr(args, "vocab_size", None)
        first, last = model_layers[layers.start], model_layers[layers.end - 1]
        self._first_edge = _Edge(inject=not layers.is_first, stop=not layers.is_last and first is last,
                            last_position=layers.is_last and first is last)
        hook(first, self._first_edge)
        self._last_edge = self._first_edge
        if last is not first:
            self._last_edge = _Edge(inject=False, stop=not layers.is_last, last_position=layers.is_last)
            hook(last, self._last_edge)
        self._cache_slots = outline.slots_of(layers.start, layers.end)
        self.unrolled = UnrolledDecode.for_shard(self)

    def _strip_outside(self, outline: Outline, dtype: mx.Dtype | None) -> None:
        """Keep the weights outside the layers that this position in the pipeline reads."""
        r = self.range
        inside = {id(m) for layer in self.model.layers for _, m in layer.named_modules()}
        for path, m in self.model.named_modules():
            if id(m) in inside:
                continue
            prefix = f"{path}." if path else ""
            is_embedding = path in outline.embedding_modules
            if is_embedding and self.hidden_size is None:
                self.hidden_size, self.activation_dtype = _embedding_shape(m, dtype)
            if is_embedding and r.is_first and self.vocab_size is None and isinstance(m.get("weight"), mx.array):
                self.vocab_size = m["weight"].shape[0]
            for key in [k for k, v in m.items() if isinstance(v, mx.array) and not k.startswith("_")]:
                phases = outline.phases(prefix + key)
                keep = ((PRE in phases and (r.is_first or not is_embedding)) or BETWEEN in phases
                        or (POST in phases and r.is_last))
                if not keep:
                    del m[key]
            if is_embedding and not r.is_first and not any(isinstance(v, mx.array) for v in m.values()):
                hook(m, _WeightlessEmbedding(self.hidden_size, self.activation_dtype))

    @property
    def owned_layers(self) -> list[nn.Module]:
        return list(self.model.layers)[self.range.start:self.range.end]

    def make_caches(self) -> ShardCaches:
        return ShardCaches(make_prompt_cache(self.model), self._cache_slots)

    def __call__(self, x: mx.array, caches: ShardCaches, every_row: bool = False) -> mx.array:
        """x is token ids (B, L) on the first shard, hidden states (B, L, D) after.

        Returns hidden states, or on the last shard the logits of the final position
        (`every_row`: of every position, (L, vocab), for prompt logprobs).
        """
        self._last_edge.last_position = self.range.is_last and not every_row
        try:
            out = self._forward(x, caches)
        finally:
            self._last_edge.last_position = self.range.is_last
        caches.advance(x.shape[1])
        if not self.range.is_last:
            return out
        return out[0] if every_row else out[0, -1]

    def _forward(self, x: mx.array, cache) -> mx.array:
        """The model's own forward over our layers: x enters at our first layer (the stand-in
        embedding hands it over), and the stand-in after our last stops it."""
        if self.range.is_first:
            ids = x
        else:
            self._first_edge.pending = x
            ids = mx.zeros(x.shape[:2], mx.int32)  # what the stand-in embedding looks at
        try:
            out = self.model(ids, cache=cache)
        except StopAfterLayer as stop:
            out = stop.hidden
        finally:
            missed, self._first_edge.pending = self._first_edge.pending, None
        if missed is not None:
            raise RuntimeError(f"{self.family}: the model's forward never reached layer {self.range.start}")
        return out

    def input_limits(self, context: int) -> InputLimits:
        """What this shard may be fed (engine/input_limits.py), for a model of `context` positions."""
        return InputLimits(context, self.vocab_size if self.range.is_first else None,
                           None if self.range.is_first else self.hidden_size)

    def example_input(self, length: int) -> mx.array:
        """An input of `length` positions this shard accepts (for probes and checks)."""
        if self.range.is_first:
            return mx.zeros((1, length), mx.int32)
        return mx.random.normal((1, length, self.hidden_size), key=mx.random.key(0)).astype(self.activation_dtype)

    @property
    def unrolls_decode(self) -> bool:
        """True when decode_batch runs several requests' steps as one pass (else it runs them one by one)."""
        return self.unrolled is not None

    @property
    def takes_padded_batches(self) -> bool:
        """True when prefill_batch and decode_kept are exact: the model's own forward on left-padded rows,
        every layer's cache a KVCache whose BatchKVCache mask hides the padding. The families the unrolled
        decode was proven on (unrolled_decode.py) are the ones known to have only such layers."""
        return self.unrolled is not None

    def decode_batch(self, x: mx.array, caches: list[ShardCaches]) -> mx.array:
        """One new position for each of B requests: x is ids (B, 1) or hidden states (B, 1, D).

        Returns hidden states (B, 1, D), or on the last shard the logits (B, vocab).
        Families not proven exact by the unrolled pass run row by row: never silently wrong.
        """
        if self.unrolled is not None:
            return self.unrolled(x, caches)
        rows = [self(x[b:b + 1], c) for b, c in enumerate(caches)]
        return mx.stack(rows) if self.range.is_last else mx.concatenate(rows, axis=0)

    def own_caches(self, owned: list) -> ShardCaches:
        """A request's caches from its own caches of our layers (in layer order)."""
        caches = make_prompt_cache(self.model)
        for c, i in zip(owned, self._cache_slots):
            caches[i] = c
        return ShardCaches(caches, self._cache_slots)

    def weight_bytes(self) -> int:
        return loaded_bytes(self)


def check_splittable(model_dir: Path) -> Outline:
    """Refuse a model whose family cannot be cut into layer ranges (UnsplittableModel), before
    any weight is read: builds it lazily and dry-runs its forward. Returns its outline (its family
    too), for whatever builds the model after (load_shard, measure_model_bytes, measure_speed)."""
    try:
        model, _ = load_model(Path(model_dir), lazy=True, strict=True)
    except (TypeError, KeyError, ValueError, AttributeError, FileNotFoundError) as e:
        raise ModelFormatError(f"{model_dir}: mlx-lm cannot build this model: {type(e).__name__}: {e}") from e
    family = families.family_of(model)
    families.refuse_unsplittable(family)
    return outline(model, family)


def load_shard(model_dir: Path, start: int, end: int | None, dtype: mx.Dtype | None = None,
               reuse: Shard | None = None, dequantize_layers: bool = False, outlined: Outline | None = None) -> Shard:
    """Build the model lazily, keep only this shard's weights, then evaluate them.

    `dtype` casts floating (non-quantized) weights, e.g. to float32 on a CPU backend
    where float16 matmuls are several times slower. `end` None means the last layer.
    Weights that `reuse` (the shard this node held before a re-plan) already holds
    are taken over as they are, so a node only reads the layers it newly owns.
    `dequantize_layers` turns quantized weights into `dtype` (see quantized.py).
    `outlined`: the model's outline (check_splittable's), else it is outlined here.
    Raises UnsplittableModel when the family cannot be cut this way.
    """
    model, _ = load_model(Path(model_dir), lazy=True, strict=True)
    if outlined is None:
        family = families.family_of(model)
        families.refuse_unsplittable(family)
        outlined = outline(model, family)
    family = outlined.family
    n_layers = len(model.layers)
    shard = Shard(model, LayerRange(start, n_layers if end is None else end, n_layers), outlined, family, dtype)
    if reuse is not None:
        _take_over(shard, reuse)
    if dequantize_layers:
        dequantize(shard.model, dtype or mx.float32)
    if dtype is not None:
        cast_floats(shard.model, dtype)
    mx.eval(shard.parameters())
    shard.eval()
    _smoke_test(shard)
    shard.weights_run_as = weights_run_as(shard.model)
    log.info("%s layers [%d, %d) of %d: %.1f MB, weights run as %s", family, shard.range.start, shard.range.end,
             n_layers, shard.weight_bytes() / 1e6, shard.weights_run_as)
    return shard


def _take_over(shard: Shard, old: Shard) -> None:
    """Arrays the old shard holds under the same names and shapes replace the unread new ones."""
    held = dict(tree_flatten(old.model.parameters()))
    taken = [(k, held[k]) for k, v in tree_flatten(shard.model.parameters())
             if k in held and held[k].shape == v.shape]
    shard.model.load_weights(taken, strict=False)


def _smoke_test(shard: Shard) -> None:
    """One forward at load, so a family that fails cut this way fails now, with its reason."""
    try:
        caches = shard.make_caches()
        mx.eval(shard(shard.example_input(2), caches), caches.arrays())
    except Exception as e:  # whatever the model's own code raises
        r = shard.range
        raise UnsplittableModel(f"{shard.family}: layers [{r.start}, {r.end}) of {r.n_layers} fail when run "
                                f"as a shard: {type(e).__name__}: {e}") from e
