"""For tests: hold every outgoing data frame to some peers, or to some addresses, for a fixed time
before it is written.

This kernel has no netem, so a test that wants a 30 ms link between two nodes on one machine sets
SWARM_HOLD_FRAMES on one of them: its data lane (lane.py) really keeps each frame to those peers
back that long, activations, tokens, probes and pings alike, in order, so what is measured of the
link (node/link_meter.py) and what requests pay on it are the same. Held frames leave from the MLX
thread, so one due during a pass leaves after it: a Pong that left late so says (lane.py), since a
real link would not have kept it.

An entry may name an address instead of a peer: frames to whichever peer is at that address, over a
link on it, are held (a slow path to a peer that has a fast one too); the path probes' frames to that
address are held the same way (node/path_choice.py). An address's entry comes before its peer's.

    SWARM_HOLD_FRAMES="PEER_ID:MS,OTHER_ID:MS"    or    "10.0.0.2:MS"    or    "*:MS"   (every peer)
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Mapping

from ..environment import HOLD_FRAMES

log = logging.getLogger(__name__)


class FrameHold:
    def __init__(self, delays_s: Mapping[str, float]) -> None:
        self.delays_s = dict(delays_s)
        self._held: deque[tuple[float, str, Any]] = deque()  # (due, peer, message), due in order per delay

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> FrameHold | None:
        """The hold SWARM_HOLD_FRAMES asks for; None when unset. ValueError names a malformed one."""
        text = HOLD_FRAMES.get(env)
        if not text:
            return None
        delays = {}
        for item in text.split(","):
            peer, sep, ms = item.strip().rpartition(":")
            try:
                delay = float(ms) / 1000
            except ValueError:
                delay = -1.0
            if not sep or not peer or not 0 <= delay <= 60:
                raise ValueError(f"{HOLD_FRAMES.name}: {item!r} is not PEER_OR_ADDRESS:MILLISECONDS (0-60000)")
            delays[peer] = delay
        log.warning("holding every data frame to %s before sending it (%s, for tests)",
                    ", ".join(f"{p} {d * 1e3:.0f} ms" for p, d in delays.items()), HOLD_FRAMES.name)
        return cls(delays)

    def delay_for(self, peer: str, address: str | None = None) -> float:
        """How long a frame to `peer` over a link on `address` (None: not known) waits."""
        if address is not None and address in self.delays_s:
            return self.delays_s[address]
        return self.delays_s.get(peer, self.delays_s.get("*", 0.0))

    def delay_to_address(self, address: str) -> float:
        """For frames whose peer is not known yet (a path probe): the address's entry, else `*`'s."""
        return self.delays_s.get(address, self.delays_s.get("*", 0.0))

    def hold(self, due: float, peer: str, message: Any) -> None:
        self._held.append((due, peer, message))

    def release_due(self, now: float, send: Callable[[str, Any, float], None]) -> float | None:
        """Send (`send(peer, message, due)`) what is due, in the order held; returns when the next is due."""
        while self._held:
            due, peer, message = self._held[0]
            if due > now:
                return min(d for d, _, _ in self._held)
            self._held.popleft()
            send(peer, message, due)
        return None
