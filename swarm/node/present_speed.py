"""The speed a node advertises, following what its passes take now: noise never moves it.

A node's speed (seconds per layer per token) is what the partitioner shares layers by, and every
node re-plans when a peer's changes, so it changes only on a real change of the machine (a build, a
game, another model on it, a CPU quota), never on noise:

- samples: seconds per layer of the stage's real decode passes of one row (passes of many positions
  or rows cost less per position: they are not compared), and while the node is idle after having
  been found slow, its speed probe's (speed_follower.py);
- they are smoothed (an exponentially weighted mean, ALPHA per sample);
- the advertised speed moves to the smoothed one only when the smoothed one has been more than
  THRESHOLD off it (slower by that factor, or faster) at every check for HOLD_S, over at least
  MIN_SAMPLES samples; back likewise;
- with no sample for STALE_S (an idle node computes nothing) nothing moves: an idle node never drifts.

Pure: the caller's clock.
"""

from __future__ import annotations

import math

ALPHA = 0.1
PROBE_ALPHA = 0.5  # a probe's sample is a mean of several steps already
THRESHOLD = 0.3
HOLD_S = 10.0
MIN_SAMPLES = 5
STALE_S = 5.0


def _round(seconds: float) -> float:
    """Three significant digits: what a profile says (the digits beyond are noise)."""
    return float(f"{seconds:.3g}")


class PresentSpeed:
    def __init__(self, advertised: float) -> None:
        self.advertised = advertised
        self.baseline = advertised  # the speed measured at start (by the probe): "not slowed"
        self.smoothed: float | None = None
        self.last_sample: float | None = None
        self._off_since: float | None = None
        self._samples_off = 0

    def sample(self, now: float, per_layer_s: float, alpha: float = ALPHA) -> None:
        if not (math.isfinite(per_layer_s) and per_layer_s > 0):
            return
        self.smoothed = per_layer_s if self.smoothed is None else (1 - alpha) * self.smoothed + alpha * per_layer_s
        self.last_sample = now
        if self._off_since is not None:
            self._samples_off += 1

    def off(self) -> bool:
        """Whether the smoothed speed is beyond the threshold of the advertised one."""
        if self.smoothed is None or self.advertised <= 0:
            return False
        ratio = self.smoothed / self.advertised
        return not 1 / (1 + THRESHOLD) <= ratio <= 1 + THRESHOLD

    def slowed(self) -> bool:
        """Whether the advertised speed is slower than the start's beyond the threshold."""
        return self.advertised > self.baseline * (1 + THRESHOLD)

    def check(self, now: float) -> float | None:
        """Apply the rule (call every second or so); the new speed to advertise, or None."""
        if self.last_sample is None or now - self.last_sample > STALE_S or not self.off():
            self._off_since, self._samples_off = None, 0
            return None
        if self._off_since is None:
            self._off_since, self._samples_off = now, 0
            return None
        if now - self._off_since < HOLD_S or self._samples_off < MIN_SAMPLES:
            return None
        self.advertised = _round(self.smoothed)
        self._off_since, self._samples_off = None, 0
        return self.advertised
