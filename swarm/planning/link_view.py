"""The links the planner sees: what each member measured of its links to the others (its profile's
`links`), as the partitioner's Links keyed (from, to). Every node reads the same profiles, so every
node plans from the same links.

Round trips only: a ping is a sample only when no pass at either end can have kept it waiting
(node/link_meter.py), but a bandwidth is a padded ping's small extra time over the least round trip,
which activations queued in the same socket also lengthen, so it is the less sure of the two. The
partitioner weighs bandwidth when it is given (partitioner/links.py).

SWARM_PLAN_LINKS=off plans as if no link had been measured."""

from __future__ import annotations

from typing import Iterable

from partitioner import Link

from ..environment import PLAN_LINKS


def members_links(profiles: Iterable, members: set[str]) -> dict[tuple[str, str], Link]:
    """`profiles`: (node id, profile) pairs; only links between `members` count."""
    out: dict[tuple[str, str], Link] = {}
    if PLAN_LINKS.is_off():
        return out
    for node_id, profile in profiles:
        if node_id not in members:
            continue
        for peer, (rtt_s, _bytes_per_s) in profile.links.items():
            if peer in members and peer != node_id:
                out[(node_id, peer)] = Link(float(rtt_s))
    return out
