"""Log lines a stranger can cause, bounded: once per key, or at most once per interval.

A peer port is open to the network, so anything logged per connection is a way
to fill a disk (a connection flood can cause hundreds of thousands of tracebacks a
minute). What a stranger triggers is logged through a LogLimiter: the first time per
key at WARNING, then at DEBUG (`once`), or at most once per `every` seconds with a
count of what was held back (`every`). The keys kept are bounded too. Any thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Hashable

MAX_KEYS = 4096


class LogLimiter:
    def __init__(self, logger: logging.Logger, level: int = logging.WARNING) -> None:
        self.log, self.level = logger, level
        self._lock = threading.Lock()
        self._seen: dict[Hashable, list] = {}  # key -> [last logged at, held back since]
        self.count = 0  # every line asked for, logged or not (what a node reports as refused)

    def once(self, key: Hashable, msg: str, *args: Any) -> None:
        """At `level` the first time for `key`, at DEBUG after that."""
        with self._lock:
            self.count += 1
            first = key not in self._seen and len(self._seen) < MAX_KEYS
            if first:
                self._seen[key] = [time.monotonic(), 0]
        self.log.log(self.level if first else logging.DEBUG, msg, *args)

    def every(self, key: Hashable, seconds: float, msg: str, *args: Any, exc_info: Any = None) -> None:
        """At `level` at most once per `seconds` for `key`, saying how many were held back."""
        now = time.monotonic()
        with self._lock:
            self.count += 1
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < seconds:
                seen[1] += 1
                return
            if seen is None and len(self._seen) >= MAX_KEYS:
                return  # too many kinds of noise: keep counting the ones we have
            held = seen[1] if seen else 0
            self._seen[key] = [now, 0]
        if held:
            msg += f" ({held} more like it in the last {seconds:.0f} s not logged)"
        self.log.log(self.level, msg, *args, exc_info=exc_info)


def limit_loop_exceptions(loop: asyncio.AbstractEventLoop, seconds: float = 10.0) -> None:
    """asyncio's own error reports (e.g. "socket.accept() out of system resource", which its accept loop
    can report a hundred times a round), at most once per `seconds` per message."""
    limiter = LogLimiter(logging.getLogger("asyncio"), logging.ERROR)

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        key = (context.get("message"), type(exc).__name__ if exc else None)
        limiter.every(key, seconds, "%s: %s", context.get("message") or "asyncio error", exc or context,
                      exc_info=exc if isinstance(exc, BaseException) else None)

    loop.set_exception_handler(handle)
