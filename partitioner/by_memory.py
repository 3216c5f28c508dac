"""`memory`: layers in proportion to each node's memory (exo's rule), overflow-safe.

Shares are n_layers * memory / total memory, rounded by largest remainder
(ties in canonical order: more memory, faster, id). exo's version could round
a node past its memory; here a node over its cap keeps only what fits and
the excess goes, one layer at a time, to the node with the most spare room.

Stage order: the first and last positions carry extra bytes, so we try
(first, last) pairs, nodes that already got layers before those that did not,
each in canonical order, and keep the first pair that fits.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .costs import max_layers_in_memory
from .model import ModelSpec, NodeCapacity
from .roles import Role, pipeline_order


def most_memory_first(node: NodeCapacity) -> tuple:
    """Most memory first, then fastest, cheapest hop out, node id: every node sorts the same view alike."""
    return (-node.memory_bytes, node.seconds_per_layer, node.hop_latency_s, node.node_id)


def memory_split(model: ModelSpec, nodes: Sequence[NodeCapacity]) -> Optional[list[tuple[str, int]]]:
    """(node_id, n_layers) in stage order, or None if the nodes cannot hold the model."""
    order = sorted(nodes, key=most_memory_first)
    shares = largest_remainder(model.n_layers, [node.memory_bytes for node in order])

    # Prefer keeping the rounded shares: roles among nodes that got layers
    # first (last taken from the far end, so stages follow canonical order),
    # then pairs that pull in a node whose share rounded to zero.
    given = [i for i in range(len(order)) if shares[i] > 0]
    spare = [i for i in range(len(order)) if shares[i] == 0]
    alone = [(i, i) for i in given + spare]
    if model.n_layers == 1:
        pairs = alone
    else:
        within = [(f, g) for f in given for g in given[::-1] if f != g] or alone[:1]
        pulled = [(f, g) for f in given + spare for g in given[::-1] + spare if f != g]
        pairs = within + [p for p in pulled + alone if p not in within]

    for f, g in pairs:
        roles = [Role.MIDDLE] * len(order)
        if f == g:
            roles[f] = Role.ALONE
        else:
            roles[f], roles[g] = Role.FIRST, Role.LAST
        layers = _fit(model, order, roles, shares)
        if layers is not None:
            return pipeline_order(
                [
                    (node.node_id, role if x else Role.IDLE, x)
                    for node, role, x in zip(order, roles, layers)
                ]
            )
    return None


def largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    """Integer shares of `total` proportional to `weights`, summing to `total`."""
    weight_sum = sum(weights)
    floors = [total * w // weight_sum for w in weights]
    remainders = [total * w % weight_sum for w in weights]
    by_remainder = sorted(range(len(weights)), key=lambda i: -remainders[i])  # stable
    for i in by_remainder[: total - sum(floors)]:
        floors[i] += 1
    return floors


def _fit(
    model: ModelSpec, order: Sequence[NodeCapacity], roles: list[Role], shares: list[int]
) -> Optional[list[int]]:
    """Shares adjusted so every node fits its memory in its role, or None."""
    caps = [
        min(max_layers_in_memory(model, node, role.is_first, role.is_last), model.n_layers)
        for node, role in zip(order, roles)
    ]
    floor = [1 if role is not Role.MIDDLE else 0 for role in roles]
    if any(cap < low for cap, low in zip(caps, floor)):
        return None
    if sum(caps) < model.n_layers:
        return None
    if Role.ALONE in roles:
        alone = roles.index(Role.ALONE)
        if caps[alone] < model.n_layers:
            return None
        return [model.n_layers if i == alone else 0 for i in range(len(roles))]

    layers = list(shares)
    # First and last must run at least one layer: take it from the richest donor.
    for i, low in enumerate(floor):
        while layers[i] < low:
            donor = max(
                (j for j in range(len(layers)) if layers[j] > floor[j]),
                key=lambda j: layers[j] - floor[j],
            )
            layers[donor] -= 1
            layers[i] += 1
    # Then move overflow to whoever has the most room (ties: canonical order).
    for i in range(len(layers)):
        while layers[i] > caps[i]:
            roomiest = max(range(len(layers)), key=lambda j: caps[j] - layers[j])
            layers[i] -= 1
            layers[roomiest] += 1
    return layers
