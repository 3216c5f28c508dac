"""One request's sampling state on the last stage, for a request with decoding rules.

Built from the rules when the request's caches start (position 0), then fed the
token ids every forward of the request carries (`observe`), prompt and generated
alike: its state is a function of the request's history, never of what this node
happened to sample, so a new last stage after churn, fed the replayed history,
samples exactly what the old one would have.

Per sampled token, in this order (mlx-lm's logits processors where they fit):
  raw logits -> logprobs (the model's own, token_logprobs.py)
             -> logit bias, repetition / presence / frequency penalties
             -> the grammar's mask (constraints.py)
             -> temperature, top-k, top-p from a key of (seed, position) (sampling.py)
All but the draw join the forward's own lazy graph (`prepare`), so they cost about
nothing beyond the grammar's mask, which is filled before the forward runs. Runs on
the MLX thread.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import (make_frequency_penalty, make_logits_processors, make_presence_penalty,
                                 make_repetition_penalty)

from .constraints import GrammarVocab
from .decoding_rules import DecodingRules
from .sampling import SamplingParams, sample
from .token_logprobs import SampledToken, TokenLogprobs, log_softmax, rows_of, top_of

WHOLE_HISTORY = 1 << 31  # mlx-lm's processors look at the last N tokens they are given: give them all


class Prepared(NamedTuple):
    drawn_from: mx.array  # the logits after bias, penalties and mask
    logprobs: mx.array | None = None  # the raw log-softmax, when logprobs are asked for
    top: mx.array | None = None  # the ids of its k best (unordered)

    def arrays(self) -> list[mx.array]:
        return [a for a in self if a is not None]


class HistoryMismatch(Exception):
    """A forward's token ids do not continue what this sampler has seen."""


class RequestSampler:
    def __init__(self, rules: DecodingRules, vocab: GrammarVocab | None):
        self.rules = rules
        self.history: list[int] = []  # the ids of positions [0, len(history))
        if rules.grammar is not None and vocab is None:
            raise ValueError("a grammar needs the vocabulary")
        self.matcher = vocab.matcher(rules.grammar) if rules.grammar is not None else None
        # (processor, whether it sees the prompt too): OpenAI's penalties count generated tokens only,
        # the repetition penalty (vLLM, Hugging Face) the prompt as well.
        self.processors: list = []
        if rules.logit_bias:
            [bias] = make_logits_processors(logit_bias=dict(rules.logit_bias))
            self.processors.append((bias, False))
        if rules.repetition_penalty != 1.0:
            self.processors.append((make_repetition_penalty(rules.repetition_penalty, WHOLE_HISTORY), True))
        if rules.presence_penalty:
            self.processors.append((make_presence_penalty(rules.presence_penalty, WHOLE_HISTORY), False))
        if rules.frequency_penalty:
            self.processors.append((make_frequency_penalty(rules.frequency_penalty, WHOLE_HISTORY), False))
        self._prompt_rows: list[TokenLogprobs] = []  # echo: rows of prompt tokens not yet sent
        self._open_row: np.ndarray | None = None  # echo: last chunk's final row, waiting for its token

    # -- the request's history ---------------------------------------------------------------
    def observe(self, pos: int, ids: list[int] | None) -> None:
        """The token ids of positions [pos, pos + len(ids)), which this forward runs."""
        if ids is None:
            raise HistoryMismatch("a forward of a request with decoding rules came without its token ids")
        if pos != len(self.history):
            raise HistoryMismatch(f"token ids for position {pos}, but {len(self.history)} positions were seen")
        if self._open_row is not None and ids:
            self._prompt_rows.append(rows_of(self._open_row, [ids[0]], self.rules.logprobs or 0))
            self._open_row = None
        prompt_len = self.rules.prompt_len
        for t in ids:
            if self.matcher is not None and len(self.history) >= prompt_len:
                self.matcher.consume(t)
            self.history.append(t)

    @property
    def checks_drafts(self) -> bool:
        """Whether it can draw at several positions of one pass: only rules whose state does not follow each
        token drawn (no grammar, no penalties) nor read prompt rows (echo). The entry drafts for no other."""
        return not self.rules.needs_history and not self.rules.echo_logprobs

    def forget_after(self, pos: int) -> None:
        """Drafts the last pass checked past `pos` were not accepted: the history ends at `pos` again."""
        del self.history[pos:]

    def wants_every_row(self, pos: int) -> bool:
        """Whether a forward from `pos` needs the logits of all its positions: rows that score prompt
        tokens (echo logprobs; the row of position q scores the token at q + 1)."""
        return self.rules.echo_logprobs and pos <= self.rules.prompt_len - 2

    def take_prompt_rows(self, logits: mx.array, pos: int) -> None:
        """logits (L, vocab) of positions [pos, pos + L): keep the rows that score prompt tokens."""
        last = min(pos + logits.shape[0] - 1, self.rules.prompt_len - 2)  # the last row scoring one
        lp = log_softmax(logits[:last - pos + 1])
        k = self.rules.logprobs or 0
        known = min(lp.shape[0], len(self.history) - 1 - pos)  # rows whose token this forward brought
        if known:
            self._prompt_rows.append(rows_of(lp[:known], self.history[pos + 1:pos + 1 + known], k))
        if known < lp.shape[0]:
            self._open_row = lp[known:]  # its token comes with the next forward

    # -- sampling ----------------------------------------------------------------------------
    def prepare(self, logits: mx.array) -> Prepared:
        """Lazily, from logits (vocab,) of the last position: the logits the token is drawn from, and the raw
        log-softmax with its k best tokens when logprobs are asked for. Call before the forward is evaluated
        and evaluate these with it: the grammar's mask is cheap now and many times dearer right after a
        forward (docs/performance.md), and the rest costs nothing inside the forward's graph."""
        drawn_from = logits
        if self.processors:
            prompt_len = self.rules.prompt_len
            everything = mx.array(self.history, dtype=mx.int32)
            generated = everything[prompt_len:]
            x = logits[None]  # a new array: mlx-lm's penalties write into the one they are given
            for processor, whole in self.processors:
                x = processor(everything if whole else generated, x)
            drawn_from = x[0]
        if self.matcher is not None:
            drawn_from = self.matcher.mask(drawn_from)
        k = self.rules.logprobs
        if k is None:
            return Prepared(drawn_from)
        raw = logits.astype(mx.float32)
        logprobs = raw - mx.logsumexp(raw)
        return Prepared(drawn_from, logprobs, mx.argpartition(-logprobs, k - 1)[:k] if k else None)

    def draw(self, prepared: Prepared, sampling: SamplingParams, position: int) -> int | SampledToken:
        """The token at `position` (and its logprobs if asked), from what `prepare` gave, evaluated."""
        token = sample(prepared.drawn_from, sampling, position)
        if prepared.logprobs is None:
            return token
        row = top_of(prepared.logprobs, prepared.top, token)
        if self._prompt_rows:
            row = TokenLogprobs.concat([*self._prompt_rows, row])
            self._prompt_rows = []
        return SampledToken(token, row)

    def sample(self, logits: mx.array, sampling: SamplingParams, position: int) -> int | SampledToken:
        """prepare + draw in one (for callers without a forward to share the evaluation with)."""
        prepared = self.prepare(logits)
        mx.eval(prepared.arrays())
        return self.draw(prepared, sampling, position)
