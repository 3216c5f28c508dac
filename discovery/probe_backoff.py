"""How often an endpoint that has not answered is asked again: back-off per endpoint, a cap per round.

The poll loop asks endpoints that are not peers yet (static peers, and with a swarm secret every
mDNS record) for a profile. Anyone can publish records, and a record may name any address: 200
records that never prove the secret made every node open ~270 handshakes a second, at endpoints
that may be a third party's. So an endpoint that fails is asked again later and later (after
FREE_TRIES failures in a row, doubling up to MAX_S: a peer that restarts or is cut off for a few
seconds is found again as quickly as before), at most PER_ROUND endpoints are asked per round
(those due longest first), and an answer resets its record. Event loop only.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, TypeVar

E = TypeVar("E", bound=Hashable)

FREE_TRIES = 3
BASE_S = 1.0
MAX_S = 8.0
PER_ROUND = 16


@dataclass
class _Record:
    failures: int = 0
    due: float = 0.0


class ProbeBackoff:
    def __init__(self, *, free_tries: int = FREE_TRIES, base_s: float = BASE_S, max_s: float = MAX_S,
                 per_round: int = PER_ROUND, clock: Callable[[], float] = time.monotonic,
                 jitter: Callable[[], float] = random.random) -> None:
        self.free_tries, self.base_s, self.max_s, self.per_round = free_tries, base_s, max_s, per_round
        self._clock, self._jitter = clock, jitter
        self._records: dict = {}

    def due(self, endpoints: Iterable[E]) -> list[E]:
        """The endpoints to ask this round: due now, longest due first, at most `per_round`. Records of
        endpoints no longer given are dropped."""
        endpoints = set(endpoints)
        for gone in set(self._records) - endpoints:
            del self._records[gone]
        now = self._clock()
        ready = [(self._records[e].due if e in self._records else 0.0, str(e), e) for e in endpoints]
        ready = [r for r in ready if r[0] <= now]
        ready.sort(key=lambda r: (r[0], r[1]))
        return [e for _, _, e in ready[:self.per_round]]

    def failed(self, endpoint: E) -> None:
        record = self._records.setdefault(endpoint, _Record())
        record.failures += 1
        extra = record.failures - self.free_tries
        if extra > 0:
            wait = min(self.max_s, self.base_s * 2 ** (extra - 1))
            record.due = self._clock() + wait * (0.75 + 0.5 * self._jitter())

    def answered(self, endpoint: E) -> None:
        self._records.pop(endpoint, None)

    def failures(self, endpoint: E) -> int:
        record = self._records.get(endpoint)
        return record.failures if record else 0
