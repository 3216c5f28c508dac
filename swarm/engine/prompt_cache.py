"""A stage's prompt cache: the caches of its layers for token sequences its requests ran, kept after them.

Chat clients and agents send the whole conversation (or the same long system prompt) again on every
turn. After a request, its entry tells each stage which tokens the request's caches hold; the stage
keeps them here, keyed by those tokens, under a byte budget, least recently used out first (mlx-lm's
own `LRUPromptCache`, the one mlx-lm's server uses). A later request whose tokens begin with a kept
sequence starts from it and prefills only the rest.

The entry picks the reused length L once and every stage must start from exactly L positions: a stage
that cannot (evicted, restarted, another plan's layers, a cache kind that cannot be cut back to L)
raises PromptCacheMiss and the entry runs the request cold. mlx-lm's trimming rules decide what can be
cut: plain KV caches can, a rotating window only while it has not wrapped, recurrent states never (so
those reuse only an exact kept sequence).

Entries are keyed by (entry node, first layer, end layer): a request only ever starts from its own
entry's sequences (an entry could otherwise name tokens its caches do not hold, and poison another
entry's requests), and caches of other layers never match. MLX thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

from .model_bytes import LayerCache
from .shard_caches import ShardCaches

MAX_ENTRIES = 256  # sequences kept per stage, whatever their bytes (the trie walks them per token)
_NOT_A_TOKEN = -1  # appended to a looked-up prefix: LRUPromptCache then leaves exactly the prefix to reuse


@dataclass(frozen=True)
class PromptCacheSize:
    """A stage's prompt cache budget: `fixed` bytes (`--prompt-cache SIZE`, taken off the memory the node
    offers the planner), or, with `fixed` None, what the plan leaves of the `offered` memory once the
    stage's weights and the KV room the plan reserves for requests in flight are counted, up to `most`."""

    fixed: int | None
    offered: int = 0
    most: int = 0
    reserve_tokens: int = 0  # positions the plan reserves per layer for requests in flight

    def for_layers(self, weight_bytes: int, caches: Sequence[LayerCache]) -> int:
        if self.fixed is not None:
            return self.fixed
        in_flight = sum(c.reserve(self.reserve_tokens) for c in caches)
        return max(0, min(self.most, self.offered - weight_bytes - in_flight))


class PromptCacheMiss(Exception):
    """This stage does not hold the prefix a request was told to start from. `quiet`: a later frame of a
    request that missed (its entry already knows, and runs it again cold)."""

    def __init__(self, message: str, quiet: bool = False):
        super().__init__(message)
        self.quiet = quiet


class _Kept(list):
    """What LRUPromptCache keeps for one sequence: each cache of a request once (what it sizes, trims and
    copies); `slots` is the request's ShardCaches over the same caches, copied along with them."""

    def __init__(self, caches: ShardCaches):
        super().__init__(caches.unique())
        self.slots = caches


@dataclass
class PromptCacheStats:
    entries: int = 0
    bytes: int = 0
    hits: int = 0
    misses: int = 0
    tokens_saved: int = 0  # positions hits did not have to compute

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class PromptCache:
    def __init__(self, max_bytes: int, max_entries: int = MAX_ENTRIES):
        self.max_bytes = max_bytes
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=max_bytes)
        self.hits = self.misses = self.tokens_saved = 0

    def keep(self, key: tuple, tokens: list[int], caches: ShardCaches, held: int) -> bool:
        """Keep `caches` (which hold `held` positions; taken over, not copied) as those of `tokens`.
        Positions past `tokens` are cut off where the cache kinds allow; False: not kept."""
        if not tokens or held < len(tokens) or self.max_bytes <= 0:
            return False
        kept = _Kept(caches)
        if held > len(tokens):
            if not can_trim_prompt_cache(kept):
                return False
            trim_prompt_cache(kept, held - len(tokens))
        if sum(c.nbytes for c in kept) > self.max_bytes:
            return False  # it would evict everything and then itself
        self._lru.insert_cache(key, list(tokens), kept)
        return True

    def start_from(self, key: tuple, prefix: list[int]) -> ShardCaches:
        """A copy of the caches of exactly `prefix` (a kept sequence itself, or a longer one cut back to it)."""
        found, rest = self._lru.fetch_nearest_cache(key, [*prefix, _NOT_A_TOKEN])
        if found is None or len(rest) != 1:
            self.misses += 1
            raise PromptCacheMiss(f"this stage keeps no caches of that {len(prefix)}-token prefix for its layers "
                                  f"(evicted, never kept, or of a cache kind that cannot be cut back to it)")
        self.hits += 1
        self.tokens_saved += len(prefix)
        return found.slots

    def stats(self) -> PromptCacheStats:
        return PromptCacheStats(len(self._lru), self._lru.nbytes, self.hits, self.misses, self.tokens_saved)

