"""How long a stage holds a long prompt's next chunk back while other requests decode (MLX thread only).

A chunk of a prompt takes a stage many decode steps' time (on a CPU, hundreds of ms for a few
dozen positions), and a step that arrives while one is computed waits for it. So while another
request's next decode step is due at this stage (two of its periods after its last one here),
the next chunk of a prompt already under way waits, but never longer than HOLD_CHUNKS times what
the last chunk took: the steps go first, and however busy the stage, long prompts get at least
1 / (1 + HOLD_CHUNKS) of its time. A
prompt's first chunk is never held (a new request starts at once), and the order of each
request's frames is kept: the stage serves other requests' frames meanwhile (stage_service.py).
"""

from __future__ import annotations

import time

from ..transport.messages import Forward

MIN_PERIOD_S = 0.5  # a decoding request's steps are taken to come at least this far apart
DUE_PERIODS = 2.0  # its next step is due for this many of its periods after its last one here
MIN_HOLD_S = 0.5  # a chunk may be held this long even after a quick chunk
# A chunk may be held this many times what the last one took. A chunk takes many steps' time, so a
# step that meets one waits long; the more a chunk is held, the fewer steps meet one.
HOLD_CHUNKS = 3
MAX_HOLD_S = 5.0  # and never longer than this (the entry's token timeout bounds a chunk's whole trip)


def is_later_chunk(message: Forward) -> bool:
    """A chunk of a prompt past its first (nothing sampled, several positions, not a request's start)."""
    return message.sampling is None and message.length > 1 and message.pos > 0 and message.prefix is None


class ChunkHold:
    def __init__(self, min_period_s: float = MIN_PERIOD_S, min_hold_s: float = MIN_HOLD_S) -> None:
        self.min_period_s, self.min_hold_s = min_period_s, min_hold_s
        self._steps: dict[tuple[str, str], tuple[float, float]] = {}  # decoding request -> (last step, period)
        self._held_since: dict[tuple[str, str], float] = {}  # (entry, rid) -> when its waiting chunk was first held
        self._chunk_s = 0.0  # how long the last chunk took here (a held one waits HOLD_CHUNKS times that at most)
        self.held = 0  # chunks held back so far (for /health)

    def served(self, message: Forward, took_s: float) -> None:
        """`message` was served here in `took_s`: a sampled one is a step of a request that decodes."""
        key, now = (message.entry, message.rid), time.monotonic()
        if message.sampling is not None:
            last = self._steps.get(key)
            period = max(self.min_period_s, now - last[0]) if last else self.min_period_s
            self._steps[key] = (now, period)
        elif is_later_chunk(message):
            self._chunk_s = took_s

    def until(self, message: Forward) -> float | None:
        """When `message` may be served (time.monotonic); None: now. A later chunk of a prompt waits
        while another request's next step is due here, but never longer than HOLD_CHUNKS times the last
        chunk took (at least min_hold_s, at most MAX_HOLD_S)."""
        if not is_later_chunk(message):
            return None
        key, now = (message.entry, message.rid), time.monotonic()
        due = self._next_due(key, now)
        since = self._held_since.get(key, now)
        until = min(due, since + min(MAX_HOLD_S, max(self.min_hold_s, HOLD_CHUNKS * self._chunk_s)))
        if now >= until:
            self._held_since.pop(key, None)
            return None
        if key not in self._held_since:
            self._held_since[key] = now
            self.held += 1
        return until

    def _next_due(self, key: tuple[str, str], now: float) -> float:
        """Until when some other request's next step is due here (past: none is)."""
        latest = float("-inf")
        for other, (last, period) in list(self._steps.items()):
            due = last + DUE_PERIODS * period
            if due <= now:
                del self._steps[other]  # (it ended, or went quiet)
            elif other != key:
                latest = max(latest, due)
        return latest

    def forget(self, key: tuple[str, str]) -> None:
        """The request was released."""
        self._held_since.pop(key, None)
        self._steps.pop(key, None)
