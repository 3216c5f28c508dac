"""A shard serving many requests, each with its own caches and position.

A request's position is counted here, not read from a cache: some cache kinds
(ArraysCache of linear-attention and state-space layers) have no offset.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx

from .sampling import SamplingParams, sample
from .shard import Shard
from .shard_caches import ShardCaches


class CacheMismatch(Exception):
    """A frame arrived for a position this stage's cache does not hold (e.g. lost state)."""


@dataclass
class _RequestState:
    caches: ShardCaches
    offset: int = 0  # positions this request's caches hold
    last_used: float = field(default_factory=time.monotonic)


class ShardRunner:
    """Synchronous: call only from the node's MLX worker thread."""

    def __init__(self, shard: Shard):
        self.shard = shard
        self._requests: dict[str, _RequestState] = {}

    @property
    def range(self):
        return self.shard.range

    def forward(self, request_id: str, x: mx.array, start_pos: int,
                sampling: SamplingParams | None = None) -> mx.array | int:
        """Run positions [start_pos, start_pos + L) of a request through this shard.

        start_pos 0 always starts the request afresh (a replay after churn does that).
        On the last stage with `sampling`, returns the sampled token for the next position.
        """
        state = self._requests.get(request_id)
        if state is None or start_pos == 0:
            state = self._requests[request_id] = _RequestState(self.shard.make_caches())
        if state.offset != start_pos:
            raise CacheMismatch(f"request {request_id}: cache holds {state.offset} positions, frame starts at {start_pos}")
        state.last_used = time.monotonic()
        try:
            out = self.shard(x, state.caches)
            mx.eval(out, state.caches.arrays())
        except Exception:
            del self._requests[request_id]  # its caches may hold part of the step
            raise
        state.offset += x.shape[1]
        if not self.range.is_last or sampling is None:
            return out
        return sample(out, sampling, start_pos + x.shape[1])

    def decode_batch(self, items: list[tuple[str, mx.array, int, SamplingParams | None]]) -> list:
        """One decode position for several requests in one pass (see Shard.decode_batch).

        items: (request id, input of one position, its position, sampling). Returns per
        item what forward would, or the CacheMismatch that request hit (the others go on).
        """
        results: list = [None] * len(items)
        rows, states = [], []
        for i, (rid, x, pos, _) in enumerate(items):
            state = self._requests.get(rid)
            if state is None or state.offset != pos or pos == 0 or x.shape[1] != 1:
                held = state.offset if state else 0
                results[i] = CacheMismatch(f"request {rid}: cache holds {held} positions, frame starts at {pos}")
                continue
            state.last_used = time.monotonic()
            rows.append(i)
            states.append(state)
        if not rows:
            return results
        try:
            out = self.shard.decode_batch(mx.concatenate([items[i][1] for i in rows], axis=0),
                                          [st.caches for st in states])
            mx.eval(out, [st.caches.arrays() for st in states])
        except Exception:
            for i in rows:
                self._requests.pop(items[i][0], None)
            raise
        for st in states:
            st.offset += 1
        for j, i in enumerate(rows):
            _, _, pos, sampling = items[i]
            if not self.range.is_last:
                results[i] = out[j:j + 1]
            elif sampling is not None:
                results[i] = sample(out[j], sampling, pos + 1)
        return results

    def release(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def release_idle(self, max_idle_s: float) -> list[str]:
        """Free the caches of requests nobody has touched for a while (their entry died)."""
        now = time.monotonic()
        stale = [rid for rid, s in self._requests.items() if now - s.last_used > max_idle_s]
        for rid in stale:
            del self._requests[rid]
        return stale

    @property
    def active_requests(self) -> int:
        return len(self._requests)
