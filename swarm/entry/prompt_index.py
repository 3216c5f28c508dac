"""The entry's index of the token sequences its finished requests left in the stages' prompt caches.

The entry decides once, for every stage, how many positions a new request reuses (engine/prompt_cache.py):
the longest common prefix of the request's history with a sequence it released through the same
route (the same nodes holding the same layers), leaving at least one position to compute. A stage that
cannot start from exactly that prefix answers a miss and the request runs cold; the index learns from it:
a sequence that missed is forgotten, a route whose caches cannot be cut back (rotating windows that
wrapped, recurrent states) reuses only whole kept sequences from then on, and a route that keeps
missing (a stage with no prompt cache) is left alone. Bounded: the most recently released sequences.
Event loop only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from mlx_lm.models.cache import PromptTrie

MAX_SEQUENCES = 256  # sequences remembered, over all routes
MIN_REUSE = 16  # a shorter shared prefix is not worth a miss's retry
# The prefix travels as int32 ids in a forward's header (transport/frames.py caps a header at 64 KiB).
MAX_REUSE = 12_000
MISSES_TO_GIVE_UP = 4  # misses in a row on a route with no hit between: its stages keep nothing for us

Route = tuple  # ((node id, first layer, end layer), ...) of a plan's stages


def route_of(plan) -> Route:
    return tuple((s.node_id, s.start, s.end) for s in plan.stages)


@dataclass
class _RouteState:
    whole_only: bool = False  # only whole kept sequences: a stage could not cut one back
    misses_in_a_row: int = 0


@dataclass(frozen=True)
class Reuse:
    length: int  # positions the request starts from
    whole: bool  # a whole kept sequence (no stage has to cut one back)


class PromptIndex:
    def __init__(self, max_sequences: int = MAX_SEQUENCES):
        self.max_sequences = max_sequences
        self._trie = PromptTrie()
        self._order: OrderedDict[tuple[Route, tuple[int, ...]], None] = OrderedDict()
        self._routes: dict[Route, _RouteState] = {}

    def reuse(self, route: Route, history: list[int]) -> Reuse | None:
        """How much of `history` a request through `route` may start from (None: run it cold)."""
        state = self._routes.get(route)
        if state is None or state.misses_in_a_row >= MISSES_TO_GIVE_UP:
            return None
        wanted = history[:min(len(history) - 1, MAX_REUSE)]
        found = self._trie.search(route, wanted)
        if found.exact is not None:
            whole, longest = len(wanted), len(wanted)
        else:
            whole = len(found.shorter) if found.shorter is not None else 0
            longest = found.common_prefix
        length = whole if state.whole_only else max(whole, longest)
        if length < MIN_REUSE:
            return None
        return Reuse(length, length == whole)

    def add(self, route: Route, tokens: list[int]) -> None:
        """The stages of `route` were told to keep the caches of `tokens`."""
        if len(tokens) < MIN_REUSE:
            return
        key = (route, tuple(tokens))
        if key in self._order:
            self._order.move_to_end(key)
            return
        self._routes.setdefault(route, _RouteState())
        self._trie.add(route, key[1], True)
        self._order[key] = None
        while len(self._order) > self.max_sequences:
            (old_route, old), _ = self._order.popitem(last=False)
            self._trie.pop(old_route, list(old))

    def hit(self, route: Route) -> None:
        if state := self._routes.get(route):
            state.misses_in_a_row = 0

    def missed(self, route: Route, history: list[int], reuse: Reuse) -> None:
        """A stage of `route` did not hold the prefix `reuse` named."""
        state = self._routes.setdefault(route, _RouteState())
        state.misses_in_a_row += 1
        if not reuse.whole:
            state.whole_only = True  # (a kept sequence may still be there whole)
            return
        prefix = tuple(history[:reuse.length])
        if (route, prefix) in self._order:
            del self._order[(route, prefix)]
            self._trie.pop(route, list(prefix))


class RoutePrompts:
    """An entry's PromptIndex seen through one route: what a pipeline (pipeline.py) asks of it. With no
    index (`--prompt-cache 0`) nothing is kept or reused."""

    def __init__(self, index: PromptIndex | None, route: Route):
        self.index, self.route = index, route

    def reusable(self, history: list[int]) -> Reuse | None:
        """How much of `history` the stages keep, from requests released with `keep` (None: nothing)."""
        return self.index.reuse(self.route, history) if self.index is not None else None

    def keeping(self, tokens: list[int] | None) -> list[int] | None:
        """The stages are being told to keep the caches of `tokens`: remembered. Returns what to tell them
        (None: they keep nothing for us)."""
        if self.index is None or not tokens:
            return None
        self.index.add(self.route, tokens)
        return tokens

    def hit(self) -> None:
        """A request that started from a kept prefix got its first token."""
        if self.index is not None:
            self.index.hit(self.route)

    def missed(self, history: list[int], reuse: Reuse) -> None:
        """A request that started from `reuse` missed: the stages do not all hold it."""
        if self.index is not None:
            self.index.missed(self.route, history, reuse)
