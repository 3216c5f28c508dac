"""One request's caches on a shard: the model's own cache list, answering for every layer.

The model's forward takes one cache per layer (`model.make_cache()`, or mlx-lm's
default) and its mask code asks some of them about positions, e.g.
`create_attention_mask(h, cache[fa_idx])` for the first full-attention layer,
which may belong to another stage. So every slot must answer like the real
cache would, while only the shard's own layers hold keys and values:

- a slot of a layer we do not own points at an owned cache of the same kind
  (same class, window, ...): it has seen the same positions;
- if we own no cache of that kind, the slot points at one *position keeper*
  per kind: a cache of that kind fed keys and values of width zero, so it runs
  the cache's own bookkeeping (offset, a rotating cache's write index) and
  holds no memory. Caches without positions (ArraysCache) need nothing.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList


def _kind(cache: Any) -> tuple:
    if isinstance(cache, CacheList):
        return (CacheList, tuple(_kind(c) for c in cache.caches))
    return (type(cache), getattr(cache, "max_size", None), getattr(cache, "keep", None),
            getattr(cache, "chunk_size", None), len(getattr(cache, "cache", ())))


def _advance_keeper(cache: Any, n: int) -> None:
    if isinstance(cache, CacheList):
        for c in cache.caches:
            _advance_keeper(c, n)
    elif hasattr(cache, "offset") and hasattr(cache, "update_and_fetch"):
        empty = mx.zeros((1, 1, n, 0))
        cache.update_and_fetch(empty, empty)


class ShardCaches(list):
    """A list with one cache per model layer (what the model's forward takes).

    `owned` are the caches of the shard's layers, in layer order; `advance(n)` moves the position
    keepers on after a forward of n positions; `arrays()` is what to evaluate.
    """

    def __init__(self, caches: list, owned: list[int]):
        """`owned`: indexes of the entries the shard's layers are handed (model_outline.Outline)."""
        kinds = [_kind(c) for c in caches]
        owned_by_kind: dict[tuple, Any] = {}
        for i in owned:
            owned_by_kind.setdefault(kinds[i], caches[i])
        self._keepers: dict[tuple, Any] = {}
        slots = []
        mine = set(owned)
        for i, cache in enumerate(caches):
            if i in mine:
                slots.append(cache)
            elif kinds[i] in owned_by_kind:
                slots.append(owned_by_kind[kinds[i]])
            else:
                slots.append(self._keepers.setdefault(kinds[i], cache))
        super().__init__(slots)
        self.owned = [caches[i] for i in owned]

    def advance(self, n: int) -> None:
        for keeper in self._keepers.values():
            _advance_keeper(keeper, n)

    def unique(self) -> list:
        """Each cache behind the slots once: the owned ones, then the position keepers (what to trim or
        size); a keeper of a kind without positions (ArraysCache) never changes, so it is left out."""
        return self.owned + [k for k in self._keepers.values() if not isinstance(k, ArraysCache)]

    def arrays(self) -> list:
        return [c.state for c in self.owned] + [c.state for c in self._keepers.values()]
