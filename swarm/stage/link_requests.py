"""Which requests each peer link carried from this node: whose entry to tell when that link breaks.

A link that breaks (a sealed frame that did not open, a reset, a failed write) may
have lost frames this node sent on it. The entry of such a request would wait out
its token timeout (120 s) for a token that never comes: a stage in the middle of
the pipeline is the only one that knows the frame went out on that link. So each
node notes, per peer, the live requests it sent forwards for, and when the link to
that peer breaks, tells their entries with an Error: they replay at once, so a tampered frame closes
that link only and the request completes.

Requests whose entry is this node or that peer are not noted: both ends of a link
see it break, and an entry's own broken link already replays its requests
(entry/entry_inbox.py, `mlx_link_broken`). Bounded: a request is forgotten when released, and at
most `per_peer` (the most recent) are kept per peer. MLX thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from ..transport.messages import Forward

MAX_PER_PEER = 4096


class Carried(NamedTuple):
    rid: str
    entry: str
    plan_id: str
    attempt: int = 0


class LinkRequests:
    def __init__(self, node_id: str, per_peer: int = MAX_PER_PEER) -> None:
        self.node_id, self.per_peer = node_id, per_peer
        self._by_peer: dict[str, OrderedDict[str, Carried]] = {}

    def note(self, peer: str, forward: Forward) -> None:
        """`forward` was sent to `peer`."""
        if forward.entry == self.node_id or forward.entry == peer or peer == self.node_id:
            return
        carried = self._by_peer.setdefault(peer, OrderedDict())
        carried[forward.rid] = Carried(forward.rid, forward.entry, forward.plan_id, forward.attempt)
        carried.move_to_end(forward.rid)
        if len(carried) > self.per_peer:
            carried.popitem(last=False)

    def forget(self, rid: str) -> None:
        """The request was released: no link break concerns it any more."""
        for carried in self._by_peer.values():
            carried.pop(rid, None)

    def broken(self, peer: str) -> list[Carried]:
        """The requests the link to `peer` carried (forgotten here: a new link starts clean)."""
        return list(self._by_peer.pop(peer, {}).values())

    def __len__(self) -> int:
        return sum(len(c) for c in self._by_peer.values())
