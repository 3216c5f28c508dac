"""What this node advertises of its link to one peer, from its pings (link_meter.py): noise kept out.

Every node plans from the same view, and a change of the view re-plans, so an advertised link changes
only when the measurement has clearly moved and stayed moved:

- round trip: the least of the samples of the last WINDOW_S (queueing, a peer busy with a pass and
  reading our ping late, a loaded machine only ever add to a round trip: the least is the link's);
  advertised once MIN_SAMPLES came, then changed only when that least differs from the advertised
  value by more than REL_CHANGE of it (and ABS_CHANGE_S) at every check for HOLD_S;
- bandwidth: a padded ping's time beyond the least round trip is what its padding took on the link
  (capped at BW_CAP: a bounded probe cannot tell faster links apart, their times are all noise); the
  most of the first BW_SAMPLES such estimates is advertised, then changed (to the median of the last
  BW_SAMPLES) only when each of those differs from it by more than BW_FACTOR, all in the same direction.

Pure: times come from the caller's clock.
"""

from __future__ import annotations

from collections import deque

from discovery import link_costs

WINDOW_S = 30.0
MIN_SAMPLES = 3
REL_CHANGE = 0.5
ABS_CHANGE_S = 0.0005
HOLD_S = 10.0
BW_SAMPLES = 3
BW_FACTOR = 2.0
BW_CAP = 2.0**28  # bytes/s (about 2 Gbit/s: 256 KiB in 1 ms, about the noise of a round trip on a busy host)


class LinkEstimate:
    def __init__(self) -> None:
        self._rtts: deque[tuple[float, float]] = deque()  # (when, seconds)
        self._bws: deque[float] = deque(maxlen=BW_SAMPLES)
        self.rtt: float | None = None  # advertised (snapped to the grid), None: not yet
        self.bw = 0.0  # advertised bytes/s, 0: unknown
        self._off_since: float | None = None  # when the measured round trip left the advertised one's band

    def least_rtt(self) -> float | None:
        return min(s for _, s in self._rtts) if self._rtts else None

    def rtt_sample(self, now: float, seconds: float) -> None:
        self._rtts.append((now, seconds))
        while self._rtts and self._rtts[0][0] < now - WINDOW_S and len(self._rtts) > MIN_SAMPLES:
            self._rtts.popleft()
        self.check(now)

    def padded_sample(self, now: float, seconds: float, pad_bytes: int) -> None:
        """A ping with `pad_bytes` of padding took `seconds` there and back."""
        least = self.least_rtt()
        if least is None or pad_bytes <= 0:
            return
        extra = seconds - least
        self._bws.append(BW_CAP if extra <= pad_bytes / BW_CAP else pad_bytes / extra)
        if not self.bw:
            if len(self._bws) == BW_SAMPLES:
                self.bw = link_costs.quantize(least, max(self._bws))[1]
            return
        if len(self._bws) == BW_SAMPLES and (all(b > self.bw * BW_FACTOR for b in self._bws)
                                             or all(b < self.bw / BW_FACTOR for b in self._bws)):
            self.bw = link_costs.quantize(least, sorted(self._bws)[BW_SAMPLES // 2])[1]

    def check(self, now: float) -> bool:
        """Apply the rule; True when the advertised round trip changed."""
        least = self.least_rtt()
        if least is None:
            return False
        if self.rtt is None:
            if len(self._rtts) < MIN_SAMPLES:
                return False
            self.rtt = link_costs.quantize(least, 0.0)[0]
            return True
        if abs(least - self.rtt) <= max(REL_CHANGE * self.rtt, ABS_CHANGE_S):
            self._off_since = None
            return False
        if self._off_since is None:
            self._off_since = now
        if now - self._off_since < HOLD_S:
            return False
        self.rtt, self._off_since = link_costs.quantize(least, 0.0)[0], None
        return True


def advertised(estimates: dict[str, LinkEstimate], own_id: str) -> dict[str, tuple[float, float]]:
    """The links to advertise: the nearest peers with an advertised round trip and bandwidth (each link
    enters the view once, whole), as many as the profile may carry (link_costs.MAX_LINKS, and
    MAX_TXT_BYTES of TXT)."""
    ranked = sorted((e.rtt, peer) for peer, e in estimates.items()
                    if e.rtt is not None and e.bw and link_costs.is_listable(peer) and peer != own_id)
    links: dict[str, tuple[float, float]] = {}
    size = 0
    for rtt, peer in ranked[:link_costs.MAX_LINKS]:
        size += link_costs.encoded_size(peer)
        if size > link_costs.MAX_TXT_BYTES - 8 * 5:  # (each TXT entry's key takes a few bytes too)
            break
        links[peer] = (rtt, estimates[peer].bw)
    return links
