"""What a shard runner holds for one request: its caches, its position, what the budget counts for it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .decode_ahead import Ahead
from .request_sampler import RequestSampler
from .shard_caches import ShardCaches

Key = tuple[str, str]  # (entry node id, request id)


@dataclass
class RequestState:
    caches: ShardCaches | None  # None while its rows are in a kept batch
    offset: int = 0  # positions this request's caches hold
    counted: int = 0  # positions the budget counts for it (a step's, from before it runs; padding too)
    padding: int = 0  # of them, left padding it holds in a kept batch
    last_used: float = field(default_factory=time.monotonic)
    sampler: RequestSampler | None = None  # the last stage's, for a request with decoding rules
    ahead: Ahead | None = None  # its next decode step, under way (decode_ahead.py)
