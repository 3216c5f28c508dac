"""When the MLX thread works: the spans between its waits for sockets and jobs (engine/worker.py).

The thread reads the data lane only while it waits, or between the passes of a run of work, so a
frame that arrives while it works waits until it is done. What this records tells how long a frame
can have waited behind work (node/link_meter.py: a round trip that counted a pass is no sample of its
link). Work done in the waits' gaps is what the thread did, whatever it was: a pass, loading layers,
reading a big frame, or a ping's own handling.

MLX thread only; the times are time.monotonic()'s.
"""

from __future__ import annotations

import itertools
from collections import deque

KEPT = 4096  # spans kept: far more than any question here walks back through
SLIGHT_S = 0.001  # work this short delays a frame no more than a busy host's noise on a round trip


class BusySpans:
    def __init__(self, now: float) -> None:
        self._spans: deque[tuple[float, float]] = deque()  # (start, end) of finished spans, oldest first
        self._since: float | None = None  # start of the span under way
        self._total = 0.0  # seconds of the finished spans, all of them
        self._known_from = now  # what came before is forgotten

    def begin(self, now: float) -> None:
        if self._since is None:
            self._since = now

    def end(self, now: float) -> None:
        since, self._since = self._since, None
        if since is None:
            return
        self._total += now - since
        if len(self._spans) == KEPT:
            self._known_from = self._spans.popleft()[1]
        self._spans.append((since, now))

    def worked(self, now: float) -> float:
        """Seconds of work so far: a clock that runs only while the thread works."""
        return self._total + (now - self._since if self._since is not None else 0.0)

    def worked_since(self, then: float, now: float) -> float:
        """Seconds of work between `then` and `now` (all of it before what is forgotten)."""
        if then < self._known_from:
            return now - then
        total = now - max(then, self._since) if self._since is not None else 0.0
        for start, end in reversed(self._spans):
            if end <= then:
                break
            total += end - max(start, then)
        return max(0.0, total)

    def quiet(self, now: float, slight: float = SLIGHT_S) -> float:
        """How far back from `now` the thread worked at most `slight` seconds in all: a frame read now
        that arrived within that long waited at most `slight` behind work."""
        left = slight
        spans = reversed(self._spans)
        if self._since is not None:
            spans = itertools.chain([(self._since, now)], spans)
        for start, end in spans:
            if end - start > left:
                return now - (end - left)
            left -= end - start
        return now - self._known_from
