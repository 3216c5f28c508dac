"""Who is in the swarm now: the peer table and the events it produces.

Pure bookkeeping, no I/O: mDNS, static-peer polling and liveness feed it
observations; it decides what is a join, an update or a leave.

Peers are keyed by node_id. A node_id can be claimed by more than one
instance (process start): a restart at the same endpoint supersedes the old
instance (leave + join, since the restarted node lost its state); two live
instances at different endpoints are a duplicate-id conflict, where the
earlier-started one is kept and the later one is expected to re-mint.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from .profile import NodeProfile, belongs_to_swarm

log = logging.getLogger(__name__)

EventKind = Literal["join", "update", "leave", "remint"]


@dataclass(frozen=True)
class PeerEvent:
    """join/update/leave of a peer; `remint` when this node itself took a new id."""

    kind: EventKind
    node_id: str
    profile: NodeProfile
    addresses: tuple[str, ...] = ()
    old_node_id: str | None = None  # only for remint

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "event": self.kind,
            "node_id": self.node_id,
            "profile": self.profile.to_dict(),
            "addresses": list(self.addresses),
        }
        if self.old_node_id is not None:
            data["old_node_id"] = self.old_node_id
        return data


@dataclass
class PeerInfo:
    profile: NodeProfile
    addresses: tuple[str, ...]  # the first is the endpoint (SWPF); liveness asks the others too
    source: str  # "mdns" | "static" | "self"
    last_seen: float = field(default_factory=time.time)  # unix time of last sign of life

    @property
    def node_id(self) -> str:
        return self.profile.node_id

    @property
    def endpoint(self) -> tuple[str, int]:
        return self.addresses[0], self.profile.peer_port


def same_endpoint(a: PeerInfo, addresses: tuple[str, ...], profile: NodeProfile) -> bool:
    return a.profile.peer_port == profile.peer_port and bool(set(a.addresses) & set(addresses))


class PeerTable:
    def __init__(self, own: NodeProfile) -> None:
        self.own = own
        self.peers: dict[str, PeerInfo] = {}

    def admit(self, profile: NodeProfile, addresses: tuple[str, ...], source: str) -> list[PeerEvent]:
        """Record that `profile` is alive at `addresses`; returns the resulting events."""
        if not addresses or not belongs_to_swarm(profile, self.own.swarm):
            return []
        if profile.instance == self.own.instance or profile.node_id == self.own.node_id:
            return []  # ourselves, or a conflict with us: Discovery handles that
        events = self._forget_reminted_instance(profile)
        current = self.peers.get(profile.node_id)
        if current is None:
            return events + self._add(profile, addresses, source)
        if current.profile.instance == profile.instance:
            current.addresses = addresses
            current.last_seen = time.time()
            if current.profile != profile:
                current.profile = profile
                events.append(PeerEvent("update", profile.node_id, profile, addresses))
            return events
        newer = (profile.started_at, profile.instance) > (current.profile.started_at, current.profile.instance)
        if same_endpoint(current, addresses, profile):
            if not newer:
                return events  # a stale record of an instance that has since restarted
            return events + self._remove(current) + self._add(profile, addresses, source)
        log.warning(
            "DUPLICATE NODE ID %s: instance %s at %s and instance %s at %s:%d; keeping the earlier-started one",
            profile.node_id, current.profile.instance, current.endpoint,
            profile.instance, addresses[0], profile.peer_port,
        )
        if newer:
            return events
        return events + self._remove(current) + self._add(profile, addresses, source)

    def mark_gone(self, node_id: str, instance: str) -> list[PeerEvent]:
        """The given instance of `node_id` is gone (goodbye or failed liveness)."""
        current = self.peers.get(node_id)
        if current is None or current.profile.instance != instance:
            return []
        return self._remove(current)

    def touch(self, node_id: str) -> None:
        if node_id in self.peers:
            self.peers[node_id].last_seen = time.time()

    def get(self, node_id: str) -> PeerInfo | None:
        return self.peers.get(node_id)

    def _forget_reminted_instance(self, profile: NodeProfile) -> list[PeerEvent]:
        # The same instance under another id re-minted: its old id has left.
        for info in list(self.peers.values()):
            if info.profile.instance == profile.instance and info.node_id != profile.node_id:
                return self._remove(info)
        return []

    def _add(self, profile: NodeProfile, addresses: tuple[str, ...], source: str) -> list[PeerEvent]:
        self.peers[profile.node_id] = PeerInfo(profile, addresses, source)
        return [PeerEvent("join", profile.node_id, profile, addresses)]

    def _remove(self, info: PeerInfo) -> list[PeerEvent]:
        del self.peers[info.node_id]
        return [PeerEvent("leave", info.node_id, info.profile, info.addresses)]
