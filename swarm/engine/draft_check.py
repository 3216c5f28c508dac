"""The last stage's check of a step that carries draft tokens (speculative decoding). MLX thread.

A verifying step runs the request's last token and k draft tokens as positions [pos, pos + k + 1) in
one pass. Its logits at every position are drawn from with the request's own rules, exactly as k + 1
steps of one position would draw them: greedy takes the argmax, a sampled request draws from the key
of (seed, position) (sampling.py), so a seeded request gives the same text with or without drafts.
Drafts are accepted while they equal what was drawn (mlx-lm's speculative_generate_step); the first
token drawn that differs, or the one after the last draft, is the step's new token. Where drafts come
from is the entry's business (entry/speculation.py): here they are only compared.

The pass wrote k - accepted positions that stand for no real token: every stage cuts them off when the
request's next step comes at an earlier position than its cache holds (ShardRunner.forward), which only
caches that can be cut back anywhere allow (`can_check_drafts`).
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from .request_sampler import RequestSampler
from .sampling import SamplingParams, sampled
from .token_logprobs import SampledToken, TokenLogprobs

MAX_DRAFTS = 64  # draft tokens one step may carry


class Checked(NamedTuple):
    """A verifying step's answer: how many drafts were accepted, the token drawn after them, and (when the
    request asks for logprobs) the rows of the accepted drafts and of that token."""

    accepted: int
    token: int
    logprobs: TokenLogprobs | None = None


def can_check_drafts(caches: list) -> bool:
    """Caches that can drop their last positions at any length: plain key/value caches. A rotating window
    past its size or a recurrent state (ArraysCache) cannot, so such a model checks no drafts."""
    return bool(caches) and all(type(c) in (KVCache, QuantizedKVCache) for c in caches)


class DraftCheck:
    """The draws at every position of a verifying pass, built on its lazy logits (they join its evaluation)."""

    def __init__(self, logits: mx.array, drafts: list[int], sampling: SamplingParams, pos: int,
                 sampler: RequestSampler | None = None):
        """`logits`: (k + 1, vocab), row i the logits of position pos + i (they draw the token at pos + i + 1)."""
        self.drafts, self.sampling, self.pos, self.sampler = drafts, sampling, pos, sampler
        rows = logits.shape[0]
        if sampler is not None:
            self.prepared = [sampler.prepare(logits[i]) for i in range(rows)]
            self.draws = None
        elif sampling.greedy:
            self.prepared, self.draws = None, mx.argmax(logits, axis=-1)
        else:
            self.prepared = None
            self.draws = mx.stack([sampled(logits[i], sampling, pos + i + 1) for i in range(rows)])

    def arrays(self) -> list:
        if self.prepared is not None:
            return [p.arrays() for p in self.prepared]
        return [self.draws]

    def result(self) -> Checked:
        """Once evaluated: accept drafts while they match the draws."""
        if self.prepared is None:
            draws = self.draws.tolist()
            accepted = 0
            while accepted < len(self.drafts) and draws[accepted] == self.drafts[accepted]:
                accepted += 1
            return Checked(accepted, int(draws[accepted]))
        rows = []
        for i, prepared in enumerate(self.prepared):
            drawn = self.sampler.draw(prepared, self.sampling, self.pos + i + 1)
            token = drawn.token if isinstance(drawn, SampledToken) else drawn
            if isinstance(drawn, SampledToken):
                rows.append(drawn.logprobs)
            if i == len(self.drafts) or token != self.drafts[i]:
                return Checked(i, int(token), TokenLogprobs.concat(rows) if rows else None)
        raise AssertionError("unreachable: the last row always ends the check")
