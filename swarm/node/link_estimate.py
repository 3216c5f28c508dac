"""What this node advertises of its link to one peer, from its pings (link_meter.py): noise kept out.

Every node plans from the same view, and a change of the view re-plans, so an advertised link changes
only when the measurement has clearly moved and stayed moved. The samples are round trips neither end's
passes kept waiting (link_meter.py drops the others), but what else loads a machine (other threads,
other programs, queues) still only ever adds to one:

- round trip: the least of the samples (the least is the link's); advertised once MIN_SAMPLES came
  over FIRST_SPAN_S, then changed only when that least differs from the advertised value by more than
  REL_CHANGE of it (and ABS_CHANGE_S) at every check for HOLD_S: the least of the last WINDOW_S for a
  faster link, of the last RISE_WINDOW_S for a slower one (a link must look slower for a long while);
- bandwidth: a padded ping's time beyond the least round trip is what its padding took on the link
  (capped at BW_CAP: a bounded probe cannot tell faster links apart, their times are all noise). A
  loaded machine only ever makes a link look slower, so the most of the estimates of the last
  BW_WINDOW_S is the link's: advertised once BW_SAMPLES came over at least BW_FIRST_SPAN_S, then
  changed only when that most differs from it by more than BW_FACTOR (a link that got slower shows
  once a whole window saw nothing faster).

The windows are counted back from the newest sample, not from now: while no sample comes (passes at
either end the whole time, a swarm busy for an hour), nothing is forgotten and nothing changes, and
what is advertised is what the last samples said; a link never sampled is not advertised.

Pure: times come from the caller's clock.
"""

from __future__ import annotations

from collections import deque

from discovery import link_costs

WINDOW_S = 30.0
RISE_WINDOW_S = 120.0
FIRST_SPAN_S = 20.0  # the first round trip advertised is the least of this long (not of a node's busy start)
MIN_SAMPLES = 3
REL_CHANGE = 0.5
ABS_CHANGE_S = 0.0005
HOLD_S = 10.0
BW_SAMPLES = 3
BW_FACTOR = 2.0
BW_WINDOW_S = 300.0
BW_FIRST_SPAN_S = 30.0
BW_CAP = 2.0**28  # bytes/s (about 2 Gbit/s: 256 KiB in 1 ms, about the noise of a round trip on a busy host)


class LinkEstimate:
    def __init__(self) -> None:
        self._rtts: deque[tuple[float, float]] = deque()  # (when, seconds)
        self._bws: deque[tuple[float, float]] = deque()  # (when, bytes/s)
        self._bw_count = 0
        self._bw_first: float | None = None
        self.rtt: float | None = None  # advertised (snapped to the grid), None: not yet
        self.bw = 0.0  # advertised bytes/s, 0: unknown
        self._off_since: float | None = None  # when the measured round trip left the advertised one's band

    def least_rtt(self, window_s: float = WINDOW_S) -> float | None:
        if not self._rtts:
            return None
        newest = self._rtts[-1][0]
        recent = [s for t, s in self._rtts if t >= newest - window_s]
        return min(recent) if len(recent) >= MIN_SAMPLES else min(s for _, s in self._rtts)

    def rtt_sample(self, now: float, seconds: float) -> None:
        self._rtts.append((now, seconds))
        while self._rtts and self._rtts[0][0] < now - RISE_WINDOW_S and len(self._rtts) > MIN_SAMPLES:
            self._rtts.popleft()
        self.check(now)

    def padded_sample(self, now: float, seconds: float, pad_bytes: int) -> None:
        """A ping with `pad_bytes` of padding took `seconds` there and back."""
        least = self.least_rtt()
        if least is None or pad_bytes <= 0:
            return
        extra = seconds - least
        self._bws.append((now, BW_CAP if extra <= pad_bytes / BW_CAP else pad_bytes / extra))
        self._bw_count += 1
        self._bw_first = now if self._bw_first is None else self._bw_first
        while self._bws[0][0] < now - BW_WINDOW_S:
            self._bws.popleft()
        most = max(b for _, b in self._bws)
        if not self.bw:
            if self._bw_count >= BW_SAMPLES and now - self._bw_first >= BW_FIRST_SPAN_S:
                self.bw = link_costs.quantize(least, most)[1]
            return
        if most > self.bw * BW_FACTOR or (most < self.bw / BW_FACTOR and self._bws[0][0] <= now - BW_WINDOW_S / 2):
            self.bw = link_costs.quantize(least, most)[1]

    def check(self, now: float) -> bool:
        """Apply the rule; True when the advertised round trip changed."""
        least = self.least_rtt()
        if least is None:
            return False
        if self.rtt is None:
            if len(self._rtts) < MIN_SAMPLES or self._rtts[-1][0] - self._rtts[0][0] < FIRST_SPAN_S:
                return False
            self.rtt = link_costs.quantize(least, 0.0)[0]
            return True
        if least > self.rtt:  # slower only when a longer window saw nothing faster
            least = self.least_rtt(RISE_WINDOW_S)
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
