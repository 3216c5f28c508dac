"""The order of stages when links differ: a token's trip through the ring, shortest first.

A token's trip is every stage's compute plus every hop: stage to stage with the step's
activations, and from the last stage back to the first with the sampled token (the entry is
usually the first stage's node, so the trip is a ring). The layer counts come from the
bottleneck search (batches); the order only decides which links the hops take, so it is chosen
for the trip, and among orders of equal trip for the lower bottleneck (a stage's compute plus its
hop out).

The trip weighs one decoded token and one prompt position alike: a hop's cost is its cost for a
one-position step plus 1/PROMPT_CHUNK of its cost for a PROMPT_CHUNK-position prompt pass. A slow
link's latency then counts mostly through decoding, its bandwidth mostly through prompts.

Search: every order for up to EXACT_MAX stages (7! = 5,040 orders); beyond, today's order and the
IMPROVED_STARTS best of the nearest-neighbour orders from every first stage, each improved by segment
reversals and moves until none helps or IMPROVE_ROUNDS rounds have passed. (Improving every start
made one plan cost N^5 key terms: 2.3 s of CPU at 32 stages, and every node plans on every peer's
update, so a 32-node swarm on a small machine did nothing else.) A hop's cost is computed once per
pair and direction. Orders that put a node where its
memory cannot hold the embedding (first) or the head (last) are never taken. Ties keep the order
that comes first in the search, which starts from today's order: with equal links, plans are
today's.
"""

from __future__ import annotations

from itertools import permutations
from typing import Sequence

from .links import HopCosts, Link
from .model import ModelSpec, NodeCapacity

PROMPT_CHUNK = 256
TOKEN_BYTES = 8  # what goes back to the entry: a token id and its position
EXACT_MAX = 7
IMPROVE_ROUNDS = 32
IMPROVED_STARTS = 3
# A node is left out for its links only when they cost a token at least this much more than typical ones.
MIN_GAIN_S = 0.001

Split = list[tuple[str, int]]


class TripCosts:
    """A split's trip and bottleneck in any order, for one model, node set and link view."""

    def __init__(self, model: ModelSpec, nodes: Sequence[NodeCapacity], hops: HopCosts):
        self.model = model
        self.by_id = {n.node_id: n for n in nodes}
        self.hops = hops
        self.step_bytes = model.activation_bytes
        self.chunk_bytes = model.activation_bytes * PROMPT_CHUNK
        self._hops: dict[tuple[str, str, bool], float] = {}
        self._outs: dict[tuple[str, str, bool], float] = {}

    def hop(self, a: str, b: str, to_entry: bool = False) -> float:
        key = (a, b, to_entry)
        cost = self._hops.get(key)
        if cost is None:
            cost = self._hops[key] = self._cost(self.hops.link(a, b), to_entry)
        return cost

    def _out(self, a: str, b: str, back: bool) -> float:
        """The bottleneck's hop out of a stage: the step's activations, or the token back to the entry."""
        key = (a, b, back)
        cost = self._outs.get(key)
        if cost is None:
            cost = self._outs[key] = self.hops.seconds(a, b, TOKEN_BYTES if back else self.step_bytes)
        return cost

    def typical_hop(self, to_entry: bool = False) -> float:
        return self._cost(self.hops.typical, to_entry)

    def _cost(self, link: Link, to_entry: bool) -> float:
        if to_entry:
            return link.seconds(TOKEN_BYTES) * (1 + 1 / PROMPT_CHUNK)
        return link.seconds(self.step_bytes) + link.seconds(self.chunk_bytes) / PROMPT_CHUNK

    def ring_hops(self, order: Sequence[str]) -> float:
        if len(order) < 2:
            return 0.0
        total = sum(self.hop(a, b) for a, b in zip(order, order[1:]))
        return total + self.hop(order[-1], order[0], to_entry=True)

    def compute(self, node_id: str, layers: int) -> float:
        return self.by_id[node_id].seconds_per_layer * layers

    def trip(self, split: Split) -> float:
        """One position's time through every stage and link, in seconds (compute counted for
        a token and a prompt position alike, as the hops are)."""
        order = [node for node, _ in split]
        return 2 * sum(self.compute(n, x) for n, x in split) + self.ring_hops(order)

    def bottleneck(self, split: Split) -> float:
        if len(split) < 2:
            return self.compute(*split[0])
        outs = [(split[i][0], split[(i + 1) % len(split)][0], i == len(split) - 1) for i in range(len(split))]
        return max(self.compute(n, x) + self._out(a, b, back) for (n, x), (a, b, back) in zip(split, outs))

    def fits(self, split: Split) -> bool:
        last = len(split) - 1
        return all(self.model.stage_bytes(x, i == 0, i == last) <= self.by_id[n].memory_bytes
                   for i, (n, x) in enumerate(split))

    def key(self, split: Split) -> tuple[float, float]:
        return (self.ring_hops([n for n, _ in split]), self.bottleneck(split))


def best_order(split: Split, costs: TripCosts) -> Split:
    """The split's stages in the order of the shortest trip; `split` itself on ties."""
    if len(split) < 2:
        return list(split)
    return _exact(split, costs) if len(split) <= EXACT_MAX else _bounded(split, costs)


def _exact(split: Split, costs: TripCosts) -> Split:
    best, best_key = list(split), costs.key(split)
    for order in permutations(split):
        ring = costs.ring_hops([node for node, _ in order])
        if ring > best_key[0]:
            continue  # a longer trip loses whatever its bottleneck (the key's second term)
        candidate = list(order)
        key = (ring, costs.bottleneck(candidate))
        if key < best_key and costs.fits(candidate):
            best, best_key = candidate, key
    return best


def _bounded(split: Split, costs: TripCosts) -> Split:
    neighbours = [_nearest_neighbour(split, first, costs) for first in range(len(split))]
    ranked = sorted(range(len(neighbours)), key=lambda i: (costs.key(neighbours[i]), i))  # (ties: first first)
    starts = [list(split)] + [neighbours[i] for i in ranked[:IMPROVED_STARTS]]
    best, best_key = list(split), costs.key(split)
    for start in starts:
        if not costs.fits(start):
            continue
        candidate = _improve(start, costs)
        key = costs.key(candidate)
        if key < best_key:
            best, best_key = candidate, key
    return best


def _nearest_neighbour(split: Split, first: int, costs: TripCosts) -> Split:
    rest = list(split)
    order = [rest.pop(first)]
    while rest:
        here = order[-1][0]
        nearest = min(range(len(rest)), key=lambda i: (costs.hop(here, rest[i][0]), i))
        order.append(rest.pop(nearest))
    return order


def _improve(order: Split, costs: TripCosts) -> Split:
    """Segment reversals and single-stage moves, first improvement, a bounded number of rounds."""
    key = costs.key(order)
    n = len(order)
    for _ in range(IMPROVE_ROUNDS):
        improved = False
        for i in range(n - 1):
            for j in range(i + 1, n):
                for candidate in (order[:i] + order[i:j + 1][::-1] + order[j + 1:],
                                  order[:i] + order[i + 1:j + 1] + [order[i]] + order[j + 1:]):
                    ring = costs.ring_hops([node for node, _ in candidate])
                    if ring > key[0]:
                        continue  # a longer trip loses whatever its bottleneck (the key's second term)
                    cand_key = (ring, costs.bottleneck(candidate))
                    if cand_key < key and costs.fits(candidate):
                        order, key, improved = candidate, cand_key, True
        if not improved:
            break
    return order
