"""The links the planner sees: what each member measured of its links to the others (its profile's
`links`), as the partitioner's Links keyed (from, to). Every node reads the same profiles, so every
node plans from the same links.

Round trips and bandwidths. A bandwidth is a padded ping's extra time over the least round trip
(node/link_meter.py), the less sure of the two: it is advertised as the most of its recent estimates
(a loaded machine only makes a link look slower: node/link_estimate.py), and the partitioner counts a
bandwidth within 8x of the swarm's typical one as typical (partitioner/links.py), so only a link
slower by an order of magnitude (100 Mbit beside 1-10 Gbit) moves stages.

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
        for peer, (rtt_s, bytes_per_s) in profile.links.items():
            if peer in members and peer != node_id:
                out[(node_id, peer)] = Link(float(rtt_s), float(bytes_per_s))
    return out
