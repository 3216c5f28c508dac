"""The links the planner sees: what each member measured of its links to the others (its profile's
`links`), as the partitioner's Links keyed (from, to). Every node reads the same profiles, so every
node plans from the same links.

Round trips only, for now: the bandwidth a node advertises is its padded pings' (node/link_meter.py),
read on the MLX thread, and a swarm busy with a long prompt from its first minute (layers loading, then
passes) advertised links many times slower than they are; planning on that moved a working plan in the
middle of the prompt. The partitioner weighs bandwidth when it is given (partitioner/links.py); the
swarm passes it once a measurement the passes cannot bias exists.

Off unless SWARM_PLAN_LINKS=on, for now: round trips are biased the same way (a pong read after a
pass), and a swarm that started a long prompt in its first minute still reordered its stages mid-prompt
on them."""

from __future__ import annotations

from typing import Iterable

from partitioner import Link

from ..environment import PLAN_LINKS


def members_links(profiles: Iterable, members: set[str]) -> dict[tuple[str, str], Link]:
    """`profiles`: (node id, profile) pairs; only links between `members` count."""
    out: dict[tuple[str, str], Link] = {}
    if (PLAN_LINKS.get() or "").lower() != "on":
        return out
    for node_id, profile in profiles:
        if node_id not in members:
            continue
        for peer, (rtt_s, _bytes_per_s) in profile.links.items():
            if peer in members and peer != node_id:
                out[(node_id, peer)] = Link(float(rtt_s))
    return out
