"""How many connections the peer port holds at once: per remote address and in all.

Every connection the listener accepts takes a slot before anything is read, and
gives it back when it closes, whoever holds it then (the listener while it says
hello or serves a purpose on the event loop, the lane on the MLX thread for a data
link). A connection over budget is closed at once: a stranger with thousands of
connections holds at most `per_address` of this node's file descriptors, a crowd
of strangers at most `total`, and the node never runs out of them (without a budget,
a few thousand connections stop its API). An honest peer needs a handful: its data
link, a probe every 0.75 s, a transfer or two.

Members (addresses of peers in the view) have a reserve strangers cannot take: a crowd of
half-finished hellos fills the strangers' share only, and the members' probes and links
still get in, so strangers cannot make this node look dead to its peers. Any thread.
"""

from __future__ import annotations

import resource
import threading

PER_ADDRESS = 32
MAX_TOTAL = 512
MEMBER_SHARE = 4  # a quarter of the total is kept for members


def default_total() -> int:
    """A quarter of the descriptors this process may open (the rest: model files, HTTP, mDNS), at most 512."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_TOTAL
    return max(16, min(MAX_TOTAL, soft // 4))


class Slot:
    """One held connection; `release` is idempotent."""

    def __init__(self, budget: "ConnectionBudget", address: str) -> None:
        self._budget, self.address = budget, address
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._budget._release(self.address)


class ConnectionBudget:
    def __init__(self, per_address: int = PER_ADDRESS, total: int | None = None) -> None:
        self.total = default_total() if total is None else total
        self.per_address = min(per_address, self.total)
        self.reserved = self.total // MEMBER_SHARE  # slots only members' connections may take
        self._lock = threading.Lock()
        self._by_address: dict[str, int] = {}
        self._held = 0

    def take(self, address: str, member: bool = False) -> Slot | None:
        """A slot for a new connection from `address` (a member's: the reserve too), or None: close it."""
        with self._lock:
            mine = self._by_address.get(address, 0)
            if mine >= self.per_address or self._held >= (self.total if member else self.total - self.reserved):
                return None
            self._by_address[address] = mine + 1
            self._held += 1
        return Slot(self, address)

    def _release(self, address: str) -> None:
        with self._lock:
            left = self._by_address.get(address, 0) - 1
            if left > 0:
                self._by_address[address] = left
            else:
                self._by_address.pop(address, None)
            self._held -= 1

    @property
    def held(self) -> int:
        return self._held

    def held_by(self, address: str) -> int:
        return self._by_address.get(address, 0)
