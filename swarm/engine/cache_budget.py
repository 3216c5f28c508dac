"""How many requests, and how many bytes of KV cache, each entry may hold on a shard, and all of them.

A request's caches live on every stage until its entry releases them (or, if the entry died,
until the idle sweep). Without a cap, any peer that may send forwards could pin caches at will:
300 one-token requests held 300 caches for ten minutes, and a few long prefills held gigabytes.
So a stage counts, per entry (the node that started the requests: whoever sends their release)
and in total, the requests it holds and their bytes, and refuses a request that would pass a cap.

Bytes are counted per position from the model's own cache shapes (engine/model_bytes.py: keys and
values per position, a fixed state per request), for every position a request reached; a
sliding window is counted as if it kept everything, so the count only errs on the safe side.
The defaults let one entry hold two whole contexts and the stage four: an honest request, at
most one context long (the entry refuses longer ones), always fits. ShardRunner keeps the caches;
this only keeps the books.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from .model_bytes import LayerCache

REQUESTS_PER_ENTRY = 64
REQUESTS = 256
CONTEXTS_PER_ENTRY = 2
CONTEXTS = 4


class CacheFull(Exception):
    """A request would hold more than its entry, or this stage, may."""


@dataclass(frozen=True)
class CacheLimits:
    requests: int = REQUESTS
    requests_per_entry: int = REQUESTS_PER_ENTRY
    kv_bytes: int | None = None  # None: no byte cap
    kv_bytes_per_entry: int | None = None
    bytes_per_position: int = 0  # this shard's layers, all of them
    bytes_per_request: int = 0  # states that do not grow with positions

    @classmethod
    def for_layers(cls, caches: Sequence[LayerCache], start: int, end: int, context: int) -> "CacheLimits":
        """The default caps for the layers [start, end) of a model whose layers keep `caches`."""
        per_position = sum(c.per_token for c in caches[start:end])
        fixed = sum(c.fixed for c in caches[start:end])
        one_context = fixed + per_position * context
        return cls(kv_bytes=CONTEXTS * one_context, kv_bytes_per_entry=CONTEXTS_PER_ENTRY * one_context,
                   bytes_per_position=per_position, bytes_per_request=fixed)


class CacheBudget:
    """The books: requests and positions held, per entry and in total. One thread (the MLX thread)."""

    def __init__(self, limits: CacheLimits | None = None):
        self.limits = limits or CacheLimits()
        self._requests: dict[str, int] = defaultdict(int)
        self._positions: dict[str, int] = defaultdict(int)
        self.requests = 0
        self.positions = 0

    def kv_bytes(self, entry: str | None = None) -> int:
        lim = self.limits
        if entry is None:
            return self.requests * lim.bytes_per_request + self.positions * lim.bytes_per_position
        return self._requests.get(entry, 0) * lim.bytes_per_request + self._positions.get(entry, 0) * \
            lim.bytes_per_position

    def refusal(self, entry: str, new_request: bool, positions: int) -> str | None:
        """Why `entry` may not start a request (new_request) and/or add `positions` to one; None if it may."""
        lim, more = self.limits, int(new_request)
        if more and self._requests.get(entry, 0) + 1 > lim.requests_per_entry:
            return f"this stage holds the most requests one entry may have cached here ({lim.requests_per_entry})"
        if more and self.requests + 1 > lim.requests:
            return f"this stage holds the most requests it caches ({lim.requests})"
        grow = more * lim.bytes_per_request + positions * lim.bytes_per_position
        if lim.kv_bytes_per_entry is not None and self.kv_bytes(entry) + grow > lim.kv_bytes_per_entry:
            return (f"the entry's requests would hold more than {lim.kv_bytes_per_entry / 1e6:.1f} MB of KV cache "
                    f"on this stage")
        if lim.kv_bytes is not None and self.kv_bytes() + grow > lim.kv_bytes:
            return f"this stage's caches would hold more than {lim.kv_bytes / 1e6:.1f} MB"
        return None

    def add(self, entry: str, new_request: bool, positions: int) -> None:
        self._requests[entry] += int(new_request)
        self.requests += int(new_request)
        self._positions[entry] += positions
        self.positions += positions

    def remove(self, entry: str, positions: int) -> None:
        """A request of `entry` that held `positions` is gone."""
        self._requests[entry] -= 1
        self.requests -= 1
        self._positions[entry] -= positions
        self.positions -= positions
        if self._requests[entry] <= 0:
            del self._requests[entry], self._positions[entry]
