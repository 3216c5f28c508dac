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

from typing import Callable

import mlx.core as mx
from mlx_lm.models.cache import KVCache, trim_prompt_cache

from .cache_budget import CacheBudget
from .request_state import Ahead, Key, RequestState
from .sampling import SamplingParams, sampled
from .shard import Shard
from .shard_caches import ShardCaches


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


class StepsAhead:
    """A runner's steps ahead: started where the caps hold one more position, taken when asked for,
    undone when not; counted (`taken`, `undone`) for /health. The runner's request states carry them
    (RequestState.ahead); `drop` frees a request whose step failed to start."""

    def __init__(self, shard: Shard, budget: CacheBudget, context: int, enabled: bool, drop: Callable[[Key], None]):
        self.shard, self.budget, self.context, self.enabled, self._drop = shard, budget, context, enabled, drop
        self.taken = self.undone = 0  # steps ahead that served the Forward asked, and undone ones

    def wanted(self, caches: ShardCaches) -> bool:
        """Should a step on these caches go ahead (mx.async_eval its token, then `start`)?"""
        return self.enabled and can_go_ahead(self.shard, caches)

    def start(self, key: Key, state: RequestState, token: mx.array, pos: int, sampling: SamplingParams) -> None:
        """Start step `pos` of `state`'s request on the lazy `token`, if the caps hold one more position."""
        if pos + 1 > self.context or self.budget.refusal(key[0], False, 1) is not None:
            return
        try:
            state.ahead = go_ahead(self.shard, state.caches, token, pos, sampling)
        except Exception:
            self._drop(key)
            raise
        self.budget.add(key[0], False, 1)
        state.counted += 1
        state.offset += 1

    def take(self, key: Key, state: RequestState) -> int:
        """The step under way is the one asked for: its token, the next step started first."""
        ahead, state.ahead = state.ahead, None
        self.taken += 1
        self.start(key, state, ahead.token_out, ahead.pos + 1, ahead.sampling)
        return self.read(state, ahead.token_out)

    @staticmethod
    def read(state: RequestState, token: mx.array) -> int:
        """Read a step's `token`; the step started on it (if any) learns which token it was built on."""
        value = token.item()
        if state.ahead is not None:
            state.ahead.token_in = value
        return value

    def settle(self, key: Key, state: RequestState) -> None:
        """A step under way that nobody asked for (another position, a batch, a release): undone."""
        state.ahead = None
        self.undone += 1
        roll_back(state.caches)
        state.offset -= 1
        state.counted -= 1
        self.budget.add(key[0], False, -1)
