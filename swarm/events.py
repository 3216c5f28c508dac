"""Topology events for the dashboard (joins, leaves, plans, requests): emitted by planning and the entry, streamed by the API."""

from __future__ import annotations

import asyncio
import time


class EventBus:
    def __init__(self, max_queue: int = 1000) -> None:
        self._subscribers: set[asyncio.Queue] = set()
        self._max = max_queue

    def subscribe(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue(self._max)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self._subscribers.discard(q)

    def emit(self, kind: str, data: dict) -> None:
        event = {"type": kind, "time": time.time(), **data}
        for q in list(self._subscribers):
            if q.full():  # a stalled watcher loses old events, never blocks the node
                q.get_nowait()
            q.put_nowait(event)
