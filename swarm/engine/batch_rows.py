"""The rows of a pass that runs several requests at once (ShardRunner.decode_batch, prefill_batch)."""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

from .sampling import SamplingParams


class DecodeStep(NamedTuple):
    """One request's next position."""
    rid: str
    x: mx.array  # its input: ids (1, 1) or hidden states (1, 1, D)
    pos: int
    sampling: SamplingParams | None  # None: nothing to sample (not the last stage, or a prefill step)
    token_ids: list[int] | None = None  # the request's token ids so far, for one with decoding rules


class PromptStart(NamedTuple):
    """A new request's first prompt chunk, from position 0 or from a kept prefix (prompt_cache.py):
    nothing sampled, no decoding rules."""
    rid: str
    x: mx.array  # ids (1, L) or hidden states (1, L, D)
    prefix: list[int] | None = None  # the token ids of the kept positions it starts after
