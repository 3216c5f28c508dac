"""Admission control at an entry node: a bounded number of active requests, a bounded queue, then 429.

Event loop only. An admitted request holds its slot from before its prompt enters the
pipeline until its last token is sent (or its client is gone). Requests beyond
`max_active` wait in a first-come-first-served queue of at most `max_queued`; beyond
that the client gets a 429 in OpenAI's error shape with a `Retry-After` header (what
OpenAI's own clients honour when they retry). So what a node holds for requests is
bounded: KV caches for at most `max_active` requests at every stage, and the prompt
ids of at most `max_queued` waiting ones (each under the API's body limit).

Retry-After is the median time recent requests held their slot, times how many
queue-lengths deep the queue is: a guess a client can act on, rounded up to whole
seconds (the header's unit), at least 1.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import deque
from contextlib import asynccontextmanager
from typing import AsyncIterator

from aiohttp import web

from .errors import ApiError, error_response

RECENT = 32  # finished requests the Retry-After guess looks back on
MAX_RETRY_AFTER_S = 60


class Overloaded(ApiError):
    """429: every slot and every queue place is taken."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(429, message, "rate_limit_error", code="overloaded")
        self.retry_after_s = retry_after_s

    def response(self, path: str = "") -> web.Response:
        resp = error_response(self.status, self.message, self.type, self.param, self.code, path=path)
        resp.headers["Retry-After"] = str(self.retry_after_s)
        return resp


class Admission:
    def __init__(self, max_active: int, max_queued: int):
        if max_active < 1 or max_queued < 0:
            raise ValueError(f"max_active must be >= 1 and max_queued >= 0, got {max_active}, {max_queued}")
        self.max_active, self.max_queued = max_active, max_queued
        self.active = 0
        self._waiting: deque[asyncio.Future] = deque()
        self._held_s: deque[float] = deque(maxlen=RECENT)
        self.refused = 0  # 429s given since start

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold an active slot for the body of the `async with`; waits in the queue, or raises Overloaded."""
        await self._acquire()
        t0 = time.monotonic()
        try:
            yield
        finally:
            self._held_s.append(time.monotonic() - t0)
            self._release()

    async def _acquire(self) -> None:
        if self.active < self.max_active and not self._waiting:
            self.active += 1
            return
        if len(self._waiting) >= self.max_queued:
            self.refused += 1
            raise Overloaded(f"this node is serving {self.active} requests and {len(self._waiting)} more are "
                             f"waiting (--max-active {self.max_active}, --max-queue {self.max_queued}); "
                             f"retry later or send to another node of the swarm", self.retry_after_s())
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            await turn  # _release hands its slot over: `active` already counts us
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._release()  # the slot was ours already: pass it on
            else:
                self._waiting.remove(turn)
            raise

    def _release(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot goes to the next in line; `active` stays
                return
        self.active -= 1

    def retry_after_s(self) -> int:
        held = statistics.median(self._held_s) if self._held_s else 1.0
        depth = (len(self._waiting) + 1) / self.max_active
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(held * depth)))

    def status(self) -> dict:
        return {"active": self.active, "queued": self.queued, "max_active": self.max_active,
                "max_queued": self.max_queued, "refused": self.refused}
