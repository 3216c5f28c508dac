"""A stage's side of the prompt cache (prompt_cache.py): requests start from kept sequences, finished ones
are kept, and the requests that missed are remembered. MLX thread only, like the runner.

Kept sequences are keyed by (entry node, first layer, end layer): a request only ever starts from its own
entry's sequences, and caches of other layers never match. A request that missed its prefix here gets
one PromptCacheMiss for its entry; the frames of that attempt still in flight are then dropped quietly
(the entry already runs it again cold).
"""

from __future__ import annotations

from collections.abc import Sequence

from .prompt_cache import PromptCache, PromptCacheMiss, PromptCacheStats
from .request_state import Key
from .shard import LayerRange
from .shard_caches import ShardCaches

MISSED_KEPT = 1024  # requests remembered as having missed their prefix (their frames in flight are dropped)


class StagePrompts:
    def __init__(self, layers: LayerRange, max_bytes: int):
        self.range = layers
        self.cache = PromptCache(max_bytes)
        self._missed: dict[Key, None] = {}  # requests that missed their prefix: their later frames are dropped

    @property
    def max_bytes(self) -> int:
        return self.cache.max_bytes

    def start(self, key: Key, prefix: list[int]) -> ShardCaches:
        """A copy of the caches of `prefix` for request `key`; PromptCacheMiss (remembered) if none is kept."""
        try:
            return self.cache.start_from(self._key(key[0]), prefix)
        except PromptCacheMiss as e:
            self._missed[key] = None
            while len(self._missed) > MISSED_KEPT:
                del self._missed[next(iter(self._missed))]
            raise PromptCacheMiss(f"request {key[1]}: {e}") from None

    def missed(self, key: Key) -> bool:
        """Did this request miss its prefix here (and has not started again since)?"""
        return key in self._missed

    def started(self, key: Key) -> None:
        """The request starts again (from position 0 or a prefix), or ends: a miss of its is forgotten."""
        self._missed.pop(key, None)

    def keep(self, entry: str, tokens: Sequence[int], caches: ShardCaches, held: int) -> bool:
        """Keep a finished request's `caches` (holding `held` positions) as those of `tokens` (a list, or a
        numpy view of a frame) for later requests of `entry`."""
        if self.max_bytes <= 0 or not 0 < len(tokens) <= held:
            return False
        ids = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        return self.cache.keep(self._key(entry), ids, caches, held)

    def stats(self) -> PromptCacheStats:
        return self.cache.stats()

    def _key(self, entry: str) -> tuple:
        return (entry, self.range.start, self.range.end)
