"""Log lines at a bounded rate: a flood of hostile frames must not become a flood of log lines
(a peer's 2,100 connections once made asyncio log 122 MiB in 72 s).

At most BURST lines per WINDOW_S seconds; past that lines are only counted, and the next
window's first line says how many went unlogged. One thread (the stage service's MLX thread).
"""

from __future__ import annotations

import logging
import time

BURST = 10
WINDOW_S = 10.0


class BoundedLog:
    def __init__(self, logger: logging.Logger, level: int = logging.WARNING, burst: int = BURST,
                 window_s: float = WINDOW_S):
        self.logger, self.level, self.burst, self.window_s = logger, level, burst, window_s
        self.count = 0  # every line asked for since start, logged or not
        self._window_start = time.monotonic()
        self._logged = 0
        self._unlogged = 0

    def mlx_line(self, message: str, *args, exc_info: bool = False) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._window_start >= self.window_s:
            if self._unlogged:
                self.logger.log(self.level, "(%d more like these in the last %.0f s, not logged)", self._unlogged,
                                now - self._window_start)
            self._window_start, self._logged, self._unlogged = now, 0, 0
        if self._logged >= self.burst:
            self._unlogged += 1
            return
        self._logged += 1
        self.logger.log(self.level, message, *args, exc_info=exc_info)
