"""Live request counters of a node, for /v1/topology and the dashboard.

The events name a request by a label, its number at this entry ("request": 17), never by its
id: a request id is what a peer's frames for that request carry, and the events stream is read
by dashboards, whoever they are (it once published ids within milliseconds, and a stranger used
them to write into other people's answers). The log, the operator's, ties the two together.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from contextlib import contextmanager
from typing import Callable

WINDOW_S = 10.0

log = logging.getLogger(__name__)


class RequestStats:
    def __init__(self, emit: Callable[[str, dict], None] | None = None, entry: str | None = None) -> None:
        """`emit(kind, data)` gets request_started/finished events, `data` naming this node as `entry` and
        the request by its label."""
        self._emit, self.entry = emit, entry
        self.active: dict[str, object] = {}  # request id -> its job (generate.py): whether it is prefilling
        self.total_requests = 0
        self.total_tokens = 0
        self.finished_prompt_chunks = 0  # prompt chunks finished requests sent (prompt_chunks.py)
        self._recent: deque[float] = deque()

    @contextmanager
    def track(self, request_id: str, job: object = None):
        """`job`: the request's GenerationJob, whose `prefilling` says whether its prompt is being read."""
        self.active[request_id] = job
        self.total_requests += 1
        label = self.total_requests
        log.debug("request %s started (#%d)", request_id, label)
        self._event("request_started", {"request": label})
        counted = self.total_tokens
        try:
            yield
        finally:
            self.active.pop(request_id, None)
            self.finished_prompt_chunks += getattr(job, "prompt_chunks", 0)
            self._event("request_finished", {"request": label, "tokens": self.total_tokens - counted})

    def token(self) -> None:
        self.total_tokens += 1
        self._recent.append(time.monotonic())

    def prefilling(self) -> int:
        """Active requests whose prompt (or a replay's history) is being read."""
        return sum(1 for job in list(self.active.values()) if getattr(job, "prefilling", False))

    def prompt_chunks(self) -> int:
        """Prompt chunks this entry sent (each a trip through every stage), finished requests' and active ones'."""
        return self.finished_prompt_chunks + sum(getattr(job, "prompt_chunks", 0) for job in list(self.active.values()))

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        while self._recent and now - self._recent[0] > WINDOW_S:
            self._recent.popleft()
        if not self._recent:
            return 0.0
        span = max(now - self._recent[0], 1.0)
        return len(self._recent) / span

    def to_dict(self) -> dict:
        return {"active_requests": len(self.active), "prefilling": self.prefilling(),
                "tokens_per_second": round(self.tokens_per_second(), 2),
                "total_requests": self.total_requests, "total_tokens": self.total_tokens,
                "prompt_chunks": self.prompt_chunks()}

    def _event(self, kind: str, data: dict) -> None:
        if self._emit is not None:
            self._emit(kind, {**data, "entry": self.entry})
