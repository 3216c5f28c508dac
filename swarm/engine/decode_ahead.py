"""A whole-model stage's next decode step, built while the device computes this one (as mlx-lm's generate_step).

A stage that holds every layer samples the token of step t and already knows step t+1's input: that token.
So before it reads the token (the sync a token must leave through), it builds step t+1 on the lazy token
and hands it to the device (`mx.async_eval`): the host's cost of building a step hides behind the
device's work instead of adding to it. When the entry's next Forward arrives, for that position and
that token (it always is, unless the request ended or replays), its step is already under way: the
runner takes it and builds the one after. Anything else (another position, a batch of several requests,
a release) rolls the cache back by the one position first. Same graph, same inputs, same sampling key:
the tokens are the ones the step would have given without it.

Only where it pays and can be undone: a GPU (on a CPU the build already hides in the compute, and a
step computed for nothing costs the cores a whole step), sampling without decoding rules, and caches
that can drop their last position (mlx-lm's plain KVCache).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import KVCache, trim_prompt_cache

from .sampling import SamplingParams, sampled
from .shard import Shard
from .shard_caches import ShardCaches


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


def can_go_ahead(shard: Shard, caches: ShardCaches) -> bool:
    """A whole model on caches that can always drop a position (a rotating one cannot once full)."""
    return (shard.range.is_first and shard.range.is_last and bool(caches.owned)
            and all(type(c) is KVCache for c in caches.owned))


def go_ahead(shard: Shard, caches: ShardCaches, token: mx.array, pos: int, sampling: SamplingParams) -> Ahead:
    """Build step `pos` on the lazy `token` and start it on the device; the caller reads `token` after."""
    out = shard(token.reshape(1, 1).astype(mx.int32), caches)
    nxt = sampled(out, sampling, pos + 1)
    mx.async_eval(nxt, caches.arrays())
    return Ahead(pos, sampling, nxt)


def roll_back(caches: ShardCaches) -> None:
    """Drop the position a step ahead wrote (it was never asked for)."""
    trim_prompt_cache(caches.owned, 1)
