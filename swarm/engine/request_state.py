"""What a shard runner holds for one request: its caches, its position, what the budget counts for it, and
the decode step it may have under way (decode_ahead.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx

from .request_sampler import RequestSampler
from .sampling import SamplingParams
from .shard_caches import ShardCaches

Key = tuple[str, str]  # (entry node id, request id)


@dataclass
class Ahead:
    """Step `pos` of a request, under way: its input is the token read afterwards (`token_in`)."""
    pos: int
    sampling: SamplingParams
    token_out: mx.array  # this step's token, not read yet
    token_in: int | None = None  # the token it was built on, once read

    def serves(self, x: mx.array, start_pos: int, sampling: SamplingParams | None) -> bool:
        """Is this the step a Forward of input `x` at `start_pos` asks for?"""
        return (start_pos == self.pos and sampling == self.sampling and x.shape == (1, 1)
                and not mx.issubdtype(x.dtype, mx.floating) and self.token_in is not None
                and int(x.item()) == self.token_in)


@dataclass
class RequestState:
    caches: ShardCaches | None  # None while its rows are in a kept batch
    offset: int = 0  # positions this request's caches hold
    drafted: int = 0  # of them, the last ones a verifying step wrote (draft_check.py): they may be cut off
    counted: int = 0  # positions the budget counts for it (a step's, from before it runs; padding too)
    padding: int = 0  # of them, left padding it holds in a kept batch
    last_used: float = field(default_factory=time.monotonic)
    sampler: RequestSampler | None = None  # the last stage's, for a request with decoding rules
    ahead: Ahead | None = None  # its next decode step, under way (decode_ahead.py)
