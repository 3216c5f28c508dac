"""The requests a shard runner holds: where each one's caches are, and what they count against the caps.

A request holds its own caches, or rows of a batch kept across decode steps (kept_batches.py): while
its rows are in one, its own caches are None and it is counted the batch's width (its positions and
its left padding), so a batch whose padding would pass an entry's cap is not formed. At a cap,
requests nobody touched for a while are freed first (their entry died). MLX thread only, like the runner.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable

from mlx_lm.models.cache import BatchKVCache, can_trim_prompt_cache, trim_prompt_cache

from .cache_budget import CacheBudget, CacheFull, CacheLimits
from .kept_batches import KeptBatch, KeptBatches
from .request_state import Key, RequestState
from .shard import Shard
from .shard_caches import ShardCaches

IDLE_EVICT_S = 60.0  # at a cap, requests idle this long are freed first: an honest one steps far more often


class HeldRequests:
    def __init__(self, shard: Shard, limits: CacheLimits | None = None):
        self.shard = shard
        self.budget = CacheBudget(limits)
        self.batches = KeptBatches()
        self.states: dict[Key, RequestState] = {}

    def start(self, key: Key, caches: ShardCaches, offset: int, length: int) -> RequestState:
        """Hold a new request on `caches`, which hold its first `offset` positions, for `length` more;
        CacheFull past a cap."""
        length += offset
        why = self.budget.refusal(key[0], True, length)
        if why is not None:
            self.release_idle(IDLE_EVICT_S)  # abandoned requests go first
            why = self.budget.refusal(key[0], True, length)
        if why is not None:
            raise CacheFull(f"request {key[1]}: {why}")
        self.budget.add(key[0], True, length)
        state = self.states[key] = RequestState(caches, offset=offset, counted=length)
        return state  # (its last_used is now)

    def grow(self, key: Key, state: RequestState, length: int) -> None:
        """Count `length` more positions for a held request; past a cap it is freed and CacheFull says why."""
        why = self.budget.refusal(key[0], False, length)
        if why is not None:
            self.release_idle(IDLE_EVICT_S)
            why = self.budget.refusal(key[0], False, length)
        if why is not None:
            self.drop(key)  # it cannot go on here: free what it holds, the entry learns why
            raise CacheFull(f"request {key[1]}: {why}")
        self.budget.add(key[0], False, length)
        state.counted += length

    def trim(self, key: Key, state: RequestState, to: int) -> bool:
        """Forget the request's positions from `to` on (drafts its last stage did not accept): False when its
        caches cannot be trimmed (mlx-lm's can_trim_prompt_cache: a rotating window past its size, a state)."""
        n = state.offset - to
        self.own(key, state)
        caches = state.caches.unique()
        if not can_trim_prompt_cache(caches) or trim_prompt_cache(caches, n) != n:
            return False
        state.offset = to
        self.budget.add(key[0], False, -n)
        state.counted -= n
        return True

    def drop(self, key: Key) -> None:
        batch = self.batches.batch_of(key)
        self.batches.discard(key)
        state = self.states.pop(key, None)
        if state is not None:
            self.budget.remove(key[0], state.counted)
        if batch is not None:
            self._count_padding(batch)

    def own(self, key: Key, state: RequestState) -> None:
        """Give a request its own caches again if its rows are in a kept batch (it runs without it)."""
        batch = self.batches.batch_of(key)
        if batch is None:
            return
        state.caches = self.shard.own_caches(self.batches.detach(key))
        self._set_padding(key, state, 0)
        self._count_padding(batch)

    def kept_batch(self, keys: list[Key], states: list[RequestState]) -> KeptBatch | None:
        """The kept batch of exactly these requests (kept_batches.py), or None when the padding it
        would add passes an entry's or the stage's cap (they then run on their own caches)."""
        width = self.batches.width_if_joined(keys, [st.offset for st in states])
        if not self.padding_fits((key, max(0, width - st.offset - st.padding)) for key, st in zip(keys, states)):
            return None
        touched = self.batches.touched(keys)
        own = {k: st.caches.owned for k, st in zip(keys, states) if st.caches is not None}
        batch, left = self.batches.batch_for(keys, own)
        for st in states:
            st.caches = None  # its rows are the batch's now: held once
        for key, owned in left.items():
            state = self.states[key]
            state.caches = self.shard.own_caches(owned)
            self._set_padding(key, state, 0)
        for b in [batch, *touched]:
            if b.members:
                self._count_padding(b)
        return batch

    def adopt(self, keys: list[Key], caches: list[BatchKVCache]) -> None:
        """Keep the batch these requests were prefilled in (its caches) for their decode steps."""
        self._count_padding(self.batches.adopt(keys, caches))

    def padding_fits(self, more_padding: Iterable[tuple[Key, int]]) -> bool:
        """Would every entry's cap hold this much more padding for these requests (a kept batch counts it)?"""
        more: dict[str, int] = defaultdict(int)
        for key, n in more_padding:
            more[key[0]] += n
        return not any(n and self.budget.refusal(entry, False, n) for entry, n in more.items())

    def release_idle(self, max_idle_s: float) -> list[str]:
        """Free the caches of requests nobody has touched for a while (their entry died)."""
        now = time.monotonic()
        stale = [key for key, s in self.states.items() if now - s.last_used > max_idle_s]
        for key in stale:
            self.drop(key)
        return [rid for _, rid in stale]

    def _set_padding(self, key: Key, state: RequestState, padding: int) -> None:
        self.budget.add(key[0], False, padding - state.padding)
        state.counted += padding - state.padding
        state.padding = padding

    def _count_padding(self, batch: KeptBatch) -> None:
        """Count each row of a batch the batch's width (a filter may have narrowed it)."""
        for key in batch.members:
            state = self.states[key]
            self._set_padding(key, state, batch.width - state.offset)
