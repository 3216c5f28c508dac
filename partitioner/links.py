"""What a hop between two nodes costs: measured links, and the defaults for pairs never measured.

A node measures its links to its peers (round trip, bandwidth) and advertises them; the planner
gets them keyed by direction, (from, to). A hop that carries `n_bytes` costs half a round trip
plus the bytes over the bandwidth. A pair measured in one direction only is taken as symmetric;
a pair measured in neither costs the median of the measured links, so an unmeasured pair looks
neither better nor worse than the swarm's typical link. A link within SAME_RTT_S of the typical
round trip and SAME_BANDWIDTH times its bandwidth counts as typical: loopback and LAN links wobble
by a tenth of a millisecond and a good part of their bandwidth, and a plan that moves moves weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median_low
from typing import Mapping, Optional, Sequence

SAME_RTT_S = 0.002
SAME_BANDWIDTH = 8.0


@dataclass(frozen=True)
class Link:
    """One direction of a measured link: round-trip seconds and bytes per second (0: not known)."""

    rtt_s: float
    bytes_per_s: float = 0.0

    def seconds(self, n_bytes: int) -> float:
        transfer = n_bytes / self.bytes_per_s if self.bytes_per_s > 0 and n_bytes > 0 else 0.0
        return self.rtt_s / 2 + transfer


LinkMap = Mapping[tuple[str, str], Link]


def validate_links(links: LinkMap) -> None:
    for (a, b), link in links.items():
        if not isinstance(link, Link):
            raise ValueError(f"link {a!r}->{b!r} must be a Link, got {type(link).__name__}")
        for name in ("rtt_s", "bytes_per_s"):
            value = getattr(link, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"link {a!r}->{b!r}: {name} must be >= 0 and finite, got {value!r}")


def _alike(link: Link, typical: Link) -> bool:
    if abs(link.rtt_s - typical.rtt_s) >= SAME_RTT_S:
        return False
    if link.bytes_per_s <= 0 or typical.bytes_per_s <= 0:
        return True
    ratio = link.bytes_per_s / typical.bytes_per_s
    return 1 / SAME_BANDWIDTH < ratio < SAME_BANDWIDTH


class HopCosts:
    """Seconds for a hop between two of the given nodes, for a payload of a given size."""

    def __init__(self, node_ids: Sequence[str], links: LinkMap):
        ids = set(node_ids)
        known = {pair: link for pair, link in links.items() if pair[0] in ids and pair[1] in ids
                 and pair[0] != pair[1]}
        self._links = dict(known)
        for (a, b), link in known.items():
            self._links.setdefault((b, a), link)
        rtts = sorted(link.rtt_s for link in known.values())
        rates = sorted(link.bytes_per_s for link in known.values() if link.bytes_per_s > 0)
        self._default: Optional[Link] = (
            Link(median_low(rtts), median_low(rates) if rates else 0.0) if rtts else None)
        if self._default is not None:
            self._links = {pair: self._default if _alike(link, self._default) else link
                           for pair, link in self._links.items()}

    @property
    def measured(self) -> bool:
        """False when no pair among these nodes was measured: hops then cost what today's rule says."""
        return self._default is not None

    @property
    def uniform(self) -> bool:
        """Every pair costs the same: the order of stages cannot matter."""
        return len(set(self._links.values())) <= 1 and (not self._links or next(iter(self._links.values()))
                                                         == self._default)

    @property
    def typical(self) -> Link:
        """The median measured link: what an unmeasured pair costs."""
        assert self._default is not None
        return self._default

    def link(self, a: str, b: str) -> Link:
        found = self._links.get((a, b))
        return found if found is not None else self.typical

    def seconds(self, a: str, b: str, n_bytes: int) -> float:
        return self.link(a, b).seconds(n_bytes)
