"""A fixed view standing for discovery in planning's tests: the nodes it yields, each with the profile
extras a test gives it, and the small model those tests plan."""

from __future__ import annotations

from discovery.profile import NodeProfile
from discovery.view import PeerInfo
from partitioner import ModelSpec

SPEC = ModelSpec(30, 10 << 20)


class FixedView:
    """`links`: what each node measured of its links (its profile's `links`), if a test gives any."""

    def __init__(self, own: str, extras: dict[str, dict], links: dict[str, dict] | None = None):
        self.own, self.extras, self.links = own, extras, links or {}

    def view(self, include_self: bool = False) -> list[PeerInfo]:
        ids = sorted(self.extras)
        return [PeerInfo(NodeProfile(n, n, "default", 8800, 8801, memory_available=8 << 30, speed=0.002,
                                     model_fingerprint="fp", extra=self.extras[n],
                                     **({"links": self.links[n]} if n in self.links else {})),
                         ("10.0.0.1",), "mdns")
                for n in ids if include_self or n != self.own]

    async def update_profile(self, **changes) -> None:
        """Our own profile's extras change (what the coordinator announces, e.g. the members it leaves out)."""
        self.extras[self.own] = {**self.extras.get(self.own, {}), **changes}
