"""Which attempt of each request a stage serves: frames of older attempts are dropped. MLX thread.

A request's entry counts its restarts (attempts: transport/messages.py, Forward): a replay after a
broken or silent pipeline, a run without the kept prefix after a miss. Frames of an attempt older
than one seen here, or than one its entry released, are dropped, and a newer attempt frees the
older one's caches first, so a replay never computes on its earlier attempt's frames still on the
way. Bounded: the most recent ATTEMPTS_KEPT requests past their first attempt, or released.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from .request_state import Key

ATTEMPTS_KEPT = 4096


class RequestAttempts:
    def __init__(self, kept: int = ATTEMPTS_KEPT) -> None:
        self.kept = kept
        self._seen: OrderedDict[Key, tuple[int, bool]] = OrderedDict()  # key -> (latest attempt, released)

    def admits(self, key: Key, attempt: int, drop_older: Callable[[], None]) -> bool:
        """May a frame of this attempt run? False: an older attempt's, or one its entry released. A newer
        attempt than the latest seen calls `drop_older` (the older one's caches go) first."""
        seen = self._seen.get(key)
        if seen is None:
            if attempt:
                self._note(key, attempt, False)
            return True
        latest, released = seen
        if attempt < latest or (attempt == latest and released):
            return False
        if attempt > latest:
            drop_older()
            self._note(key, attempt, False)
        return True

    def released(self, key: Key, attempt: int) -> None:
        """Its entry let the request go: frames of `attempt` or older are dropped from now on."""
        self._note(key, max(self._seen.get(key, (0, False))[0], attempt), True)

    def _note(self, key: Key, attempt: int, released: bool) -> None:
        self._seen[key] = (attempt, released)
        self._seen.move_to_end(key)
        while len(self._seen) > self.kept:
            self._seen.popitem(last=False)
