"""How long a stage holds a long prompt's next chunk back while other requests decode (MLX thread only).

A chunk of a prompt takes a stage many decode steps' time (on a CPU, hundreds of ms for a few
dozen positions), and a step that arrives while one is computed waits for it. So while decode
steps pass through this stage (one did within HOLD_AFTER_STEP_S: more are coming), the next chunk
of a prompt already under way waits, HOLD_MAX_S at most: the steps go first, and a long prompt
still gets a chunk through every HOLD_MAX_S however busy the stage is. A prompt's first chunk is
never held (a new request starts at once), and the order of each request's frames is kept: the
stage serves other requests' frames meanwhile (stage_service.py).
"""

from __future__ import annotations

import time

from ..transport.messages import Forward

HOLD_AFTER_STEP_S = 1.0  # a sampled step passed this recently: the next of its request is coming
HOLD_MAX_S = 2.0  # the longest one chunk is held


def is_later_chunk(message: Forward) -> bool:
    """A chunk of a prompt past its first (nothing sampled, several positions, not a request's start)."""
    return message.sampling is None and message.length > 1 and message.pos > 0 and message.prefix is None


class ChunkHold:
    def __init__(self, after_step_s: float = HOLD_AFTER_STEP_S, max_s: float = HOLD_MAX_S) -> None:
        self.after_step_s, self.max_s = after_step_s, max_s
        self._last_step = float("-inf")  # time.monotonic() of the last sampled step served here
        self._held_since: dict[tuple[str, str], float] = {}  # (entry, rid) -> when its waiting chunk was first held
        self.held = 0  # chunks held back so far (for /health)

    def stepped(self, message: Forward) -> None:
        """`message` was served here: a sampled one says other requests are decoding."""
        if message.sampling is not None:
            self._last_step = time.monotonic()

    def until(self, message: Forward) -> float | None:
        """When `message` may be served (time.monotonic); None: now."""
        if not is_later_chunk(message):
            return None
        key, now = (message.entry, message.rid), time.monotonic()
        since = self._held_since.get(key)
        until = min(self._last_step + self.after_step_s, (since or now) + self.max_s)
        if now >= until:
            self._held_since.pop(key, None)
            return None
        if since is None:
            self._held_since[key] = now
            self.held += 1
        return until

    def forget(self, key: tuple[str, str]) -> None:
        """The request was released."""
        self._held_since.pop(key, None)
