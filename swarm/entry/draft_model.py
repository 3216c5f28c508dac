"""A draft model at the entry (`--draft-model`): a small model of the served model's tokenizer whose greedy
tokens are a request's drafts (speculation.py decides when, and how many). Methods named mlx_* run on the
MLX thread (engine/worker.py); the generation loop awaits them there, so the event loop is never held.

Held by the entry node only, whole: it is not planned, split or advertised, and its weights come off the
memory the node offers the swarm. Checked before the node serves (check_draft_model): its vocabulary must
be the served model's, token for token, or its ids would name other tokens; and its caches must be able to
drop positions (those of rejected drafts), as mlx-lm's speculative decoding asks of a draft model.

Each request has a KV cache of the draft model of its own (mlx-lm's make_prompt_cache), made at its first
drafting step and freed when the request ends. The cache follows the request's history by itself: a step
compares the tokens it holds with the history it is given (the prompt and the tokens accepted so far),
cuts it back to where they agree (trim_prompt_cache: the drafts that were rejected), reads what it lacks
(the prompt, at the first step, in chunks of one job each, so the MLX thread serves the stages between
them; tokens drafted by prompt lookup or accepted from a step that ran ahead), then drafts. A replay
changes nothing here: the history holds what was accepted only.
"""

from __future__ import annotations

import logging
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import load_model, load_tokenizer

from ..engine.draft_check import can_check_drafts
from ..engine.quantized import cast_floats, dequantize
from ..engine.worker import MlxWorker
from ..models.errors import ModelError, ModelFormatError, ModelNotFoundError
from ..models.resolve import LocalModel, is_local_spec, resolve_model, where_not_found
from .generate import default_prefill_alone

log = logging.getLogger(__name__)


def check_draft_model(spec: str, served: LocalModel, served_tokenizer, cache_root: Path | None = None,
                      backend: str | None = None) -> LocalModel:
    """The draft model `--draft-model spec` names, resolved as `--model` resolves a local one and checked
    against the served model; raises ModelError with one line naming both and why not."""
    if not is_local_spec(spec):
        raise ModelNotFoundError(f"draft model {spec}: {where_not_found(spec)} (a draft model is not fetched "
                                 "from peers)")
    try:
        draft = resolve_model(spec, cache_root, backend)
    except ModelError as e:
        raise type(e)(f"draft model: {e}") from None
    why = _vocabulary_differs(load_tokenizer(draft.path).get_vocab(), served_tokenizer.get_vocab())
    if why:
        raise ModelFormatError(f"draft model {spec} cannot draft for {served.model_id}: their vocabularies "
                               f"differ ({why})")
    try:
        model, _ = load_model(draft.path, lazy=True, strict=True)  # (no weight is read)
    except (TypeError, KeyError, ValueError, AttributeError, FileNotFoundError) as e:
        raise ModelFormatError(f"draft model {spec}: mlx-lm cannot build it: {type(e).__name__}: {e}") from None
    if not can_check_drafts(make_prompt_cache(model)):
        raise ModelFormatError(f"draft model {spec} cannot draft for {served.model_id}: its caches (a sliding "
                               "window or a recurrent state) cannot drop the positions of rejected drafts")
    return draft


def _vocabulary_differs(draft: dict[str, int], served: dict[str, int]) -> str:
    """Why two vocabularies (token -> id) differ, in a few words; '' when they are the same."""
    if draft == served:
        return ""
    sizes = f"{len(draft)} and {len(served)} tokens"
    for token in sorted(draft.keys() | served.keys(), key=lambda t: min(draft.get(t, 1 << 30), served.get(t, 1 << 30))):
        here, there = draft.get(token), served.get(token)
        if here != there:
            if here is None or there is None:
                return f"{sizes}; {token!r} is in the {'served' if here is None else 'draft'} model's only"
            return f"{sizes}; {token!r} is {here} in the draft model, {there} in the served one"
    return sizes


def mlx_load_draft(path: Path, dtype: mx.Dtype | None = None, dequantize_weights: bool = False) -> nn.Module:
    """The whole draft model, its weights read and cast as the node's own (--dtype, --dequantize)."""
    model, _ = load_model(Path(path), lazy=True, strict=True)
    if dequantize_weights:
        dequantize(model, dtype or mx.float32)
    if dtype is not None:
        cast_floats(model, dtype)
    mx.eval(model.parameters())
    model.eval()
    return model


class DraftModel:
    """The loaded draft model, shared by the entry's requests."""

    def __init__(self, model: nn.Module, name: str, worker: MlxWorker, vocab_limit: int | None = None,
                 chunk: int | None = None):
        """`vocab_limit`: the served model's logits' width (a draft at or past it is no token it can check);
        `chunk`: most positions read in one MLX-thread job (that of a prompt alone at its entry: drafting
        happens only there)."""
        self.model, self.name, self.worker, self.vocab_limit = model, name, worker, vocab_limit
        self.chunk = chunk or default_prefill_alone()
        self.weight_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        self.requests = 0  # request caches held now
        self.jobs = 0  # MLX-thread jobs run, for tests

    @classmethod
    async def load(cls, model: LocalModel, worker: MlxWorker, dtype: mx.Dtype | None, dequantize_weights: bool,
                   vocab_limit: int | None) -> DraftModel:
        loaded = await worker.run(mlx_load_draft, model.path, dtype, dequantize_weights)
        draft = cls(loaded, model.model_id, worker, vocab_limit)
        log.info("draft model %s: %.1f MB, from %s", model.model_id, draft.weight_bytes / 1e6, model.path)
        return draft

    def for_request(self) -> RequestDrafts:
        return RequestDrafts(self)


class RequestDrafts:
    """One request's drafting with the draft model (a DraftSource, speculation.py). Each call's history
    extends the last one's: the request's prompt and the tokens accepted so far."""

    def __init__(self, model: DraftModel):
        self.model = model
        self.cache: list | None = None  # the request's draft KV cache (MLX thread)
        self.held: list[int] = []  # the tokens whose positions it holds
        self._sure = 0  # the last call's history: the cache agrees with it as far as it holds it
        self._closed = False

    async def __call__(self, history: list[int], k: int) -> list[int]:
        while (drafts := await self.model.worker.run(self.mlx_step, history, k)) is None:
            pass  # (a chunk of the history was read: the thread served others meanwhile)
        return drafts

    def close(self) -> None:
        """The request ended: its cache goes (after a job of it under way, on the MLX thread)."""
        self._closed = True
        self.model.worker.post(self.mlx_free)

    def offset(self) -> int:
        return self.cache[0].offset if self.cache else 0

    def mlx_step(self, history: list[int], k: int) -> list[int] | None:
        """Read up to a chunk of the history the cache lacks; once it holds all but the last token, the k
        greedy tokens after the history. None: a chunk was read, more is to come."""
        m = self.model
        m.jobs += 1
        if self._closed:
            return []
        if self.cache is None:
            self.cache = make_prompt_cache(m.model)
            m.requests += 1
        agreed = self._agreed(history)
        if agreed < len(self.held):
            trim_prompt_cache(self.cache, len(self.held) - agreed)
            del self.held[agreed:]
        self._sure = len(history)
        todo = history[agreed:]
        if len(todo) - 1 > m.chunk:
            chunk = todo[:m.chunk]
            m.model(mx.array([chunk]), cache=self.cache)
            mx.eval([c.state for c in self.cache])
            self.held += chunk
            return None
        logits = m.model(mx.array([todo]), cache=self.cache)[:, -1, :]
        drawn = []
        for i in range(k):  # (one lazy graph of k passes, evaluated once)
            drawn.append(mx.argmax(logits, axis=-1))
            if i < k - 1:
                logits = m.model(drawn[-1][:, None], cache=self.cache)[:, -1, :]
        drafts = mx.concatenate(drawn).tolist()
        mx.eval([c.state for c in self.cache])
        self.held += todo + drafts[:-1]
        if m.vocab_limit is not None:
            drafts = drafts[:next((i for i, t in enumerate(drafts) if t >= m.vocab_limit), len(drafts))]
        return drafts

    def _agreed(self, history: list[int]) -> int:
        """Positions the cache holds that agree with `history`, all but its last token at most (whose
        logits the drafts need: a step that comes again with the same history reads it again)."""
        end = min(len(self.held), len(history) - 1)
        i = min(self._sure, end)
        while i < end and self.held[i] == history[i]:
            i += 1
        return i

    def mlx_free(self) -> None:
        if self.cache is not None:
            self.cache = None
            self.held = []
            self.model.requests -= 1
