"""Live request counters of a node, for /v1/topology and the dashboard."""

from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from typing import Callable

WINDOW_S = 10.0


class RequestStats:
    def __init__(self, emit: Callable[[str, dict], None] | None = None, entry: str | None = None) -> None:
        """`emit(kind, data)` gets request_started/finished events, `data` naming this node as `entry`."""
        self._emit, self.entry = emit, entry
        self.active: set[str] = set()
        self.total_requests = 0
        self.total_tokens = 0
        self._recent: deque[float] = deque()

    @contextmanager
    def track(self, request_id: str):
        self.active.add(request_id)
        self.total_requests += 1
        self._event("request_started", {"request_id": request_id})
        counted = self.total_tokens
        try:
            yield
        finally:
            self.active.discard(request_id)
            self._event("request_finished", {"request_id": request_id, "tokens": self.total_tokens - counted})

    def token(self) -> None:
        self.total_tokens += 1
        self._recent.append(time.monotonic())

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        while self._recent and now - self._recent[0] > WINDOW_S:
            self._recent.popleft()
        if not self._recent:
            return 0.0
        span = max(now - self._recent[0], 1.0)
        return len(self._recent) / span

    def to_dict(self) -> dict:
        return {"active_requests": len(self.active), "tokens_per_second": round(self.tokens_per_second(), 2),
                "total_requests": self.total_requests, "total_tokens": self.total_tokens}

    def _event(self, kind: str, data: dict) -> None:
        if self._emit is not None:
            self._emit(kind, {**data, "entry": self.entry})
