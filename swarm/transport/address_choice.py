"""Which of a peer's addresses its data link takes, and the order to fall back in.

A peer can be reachable at several addresses (Wi-Fi and a Thunderbolt bridge, Ethernet and Wi-Fi);
discovery lists them all, the first as the peer gave it. Each address's round trip is measured
(node/path_choice.py) and the link takes the least one; the others, best first, are what a dial tries
when the chosen one does not answer.

- an address's round trip is the least of its last SAMPLES (a loaded machine only ever adds to one);
- the choice moves to a faster address only for a clear gain: by more than SWITCH_GAIN_S and more
  than SWITCH_GAIN_REL of the current one's round trip (two equal paths never flap);
- an address that failed FAILURES_TO_DROP probes in a row is dropped at once: the choice moves to the
  best one that answers, and it stays out until it answers again;
- before anything is measured, and for a peer with one address, the choice is discovery's first.

Pure: no I/O, no clock; the caller's thread (path_choice.py's event loop) owns it.
"""

from __future__ import annotations

from collections import deque

SAMPLES = 5
SWITCH_GAIN_S = 0.001
SWITCH_GAIN_REL = 0.2
FAILURES_TO_DROP = 2


class AddressChoice:
    def __init__(self, addresses: tuple[str, ...]) -> None:
        self.addresses: tuple[str, ...] = ()
        self._rtts: dict[str, deque[float]] = {}
        self._failures: dict[str, int] = {}
        self.chosen = addresses[0]
        self.update(addresses)

    def update(self, addresses: tuple[str, ...]) -> None:
        """Discovery's list changed: forget what is gone; a chosen address that is gone gives way."""
        self.addresses = tuple(addresses)
        for gone in set(self._rtts) - set(addresses):
            del self._rtts[gone]
        for gone in set(self._failures) - set(addresses):
            del self._failures[gone]
        if self.chosen not in addresses:
            self.chosen = self.order()[0]

    def rtt(self, address: str) -> float | None:
        samples = self._rtts.get(address)
        return min(samples) if samples else None

    def working(self, address: str) -> bool:
        return self._failures.get(address, 0) < FAILURES_TO_DROP

    def measured(self, address: str, seconds: float) -> bool:
        """A round trip of `address`; True when the choice moved."""
        if address not in self.addresses:
            return False
        self._rtts.setdefault(address, deque(maxlen=SAMPLES)).append(seconds)
        self._failures.pop(address, None)
        return self._choose()

    def failed(self, address: str) -> bool:
        """A probe of `address` got no answer; True when the choice moved."""
        if address not in self.addresses:
            return False
        self._failures[address] = self._failures.get(address, 0) + 1
        return self._choose()

    def order(self) -> list[str]:
        """Every address, the one to dial first: the chosen one, then those that answer (measured ones by
        round trip, then discovery's order), then those that do not."""
        def rank(address: str) -> tuple:
            rtt = self.rtt(address)
            return (address != self.chosen, not self.working(address), rtt is None, rtt or 0.0,
                    self.addresses.index(address))
        return sorted(self.addresses, key=rank)

    def _choose(self) -> bool:
        before = self.chosen
        candidates = [a for a in self.addresses if self.working(a) and self.rtt(a) is not None]
        if not self.working(self.chosen):
            others = [a for a in self.addresses if a != self.chosen and self.working(a)]
            if others:  # the fastest that answers, else discovery's next
                self.chosen = min(others, key=lambda a: (self.rtt(a) is None, self.rtt(a) or 0.0,
                                                         self.addresses.index(a)))
        elif candidates and (current := self.rtt(self.chosen)) is not None:
            best = min(candidates, key=self.rtt)
            gain = current - self.rtt(best)
            if gain > SWITCH_GAIN_S and gain > SWITCH_GAIN_REL * current:
                self.chosen = best
        return self.chosen != before
