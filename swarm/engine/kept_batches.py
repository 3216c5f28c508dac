"""Decode batches a stage keeps across steps, on mlx-lm's BatchKVCache (as its BatchGenerator does).

A decode pass of B requests on per-request caches updates each row's cache and runs
its attention row by row (unrolled_decode.py): a few small ops per row per layer. A
batch kept here holds one `BatchKVCache` per layer of the shard for all its rows, so
the model's own forward runs one op of each per layer for all rows. Requests come back
to a stage as the same cohort step after step, so the batch is used as it is when the
same set of requests comes back (in any order), and changed only when the set does:

- a request that joins has its caches merged in (`BatchKVCache.merge`, `extend`);
- one that is not in the pass (finished, cancelled, released, replayed, or run alone)
  is filtered out (`filter`), its own caches extracted back first when it goes on
  (`extract`: without the padding, exactly the positions it holds);
- a pass whose requests sit in several batches gathers them into the batch that holds
  most of them; the others keep their batches.

Prompts prefilled in one padded pass start in the batch of that pass (`adopt`), so their first
decode step finds it as it is (splitting it into each row's caches and merging them back would
make that first step cost about twice a later one).

A request's rows live in at most one batch, and while they do its own caches are gone
(ShardRunner sets them to None), so memory is held once. Each row of a batch holds the
batch's width of positions (its own plus left padding): the runner counts that width
against the request's entry (cache_budget.py). MLX thread only, like the runner.
"""

from __future__ import annotations

from typing import Hashable

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache


class KeptBatch:
    """Rows `members` (request keys, in row order) and one BatchKVCache per owned layer."""

    def __init__(self, members: list[Hashable], caches: list[BatchKVCache]):
        self.members, self.caches = members, caches

    @property
    def width(self) -> int:
        """Positions every row holds (its own and its left padding)."""
        return self.caches[0].size()

    def arrays(self) -> list:
        return [(c.keys, c.values, c.offset, c.left_padding) for c in self.caches]

    def take_out(self, keys: list[Hashable], extract: bool) -> dict[Hashable, list[KVCache]]:
        """Remove these rows; with `extract`, each one's own caches (per owned layer) are returned."""
        rows = {k: self.members.index(k) for k in keys}
        out = {k: [c.extract(r) for c in self.caches] for k, r in rows.items()} if extract else {}
        keep = [i for i, k in enumerate(self.members) if k not in rows]
        self.members = [self.members[i] for i in keep]
        if keep:  # an emptied batch is dropped by its owner, never filtered to nothing
            index = mx.array(keep)
            for c in self.caches:
                c.filter(index)
        return out

    def put_in(self, rows: dict[Hashable, list[KVCache]]) -> None:
        """Add rows (each one's own caches per owned layer) at the end."""
        joined = _merge(list(rows.values()), len(self.caches))
        for mine, theirs in zip(self.caches, joined):
            mine.extend(theirs)
        self.members += list(rows)


def _merge(rows: list[list[KVCache]], n_layers: int) -> list[BatchKVCache]:
    return [BatchKVCache.merge([row[i] for row in rows]) for i in range(n_layers)]


class KeptBatches:
    """The batches of one stage, and which batch each request's rows are in."""

    def __init__(self) -> None:
        self._of: dict[Hashable, KeptBatch] = {}
        self.reused = 0  # passes that found their batch kept as it was (the rest merged or filtered)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._of

    def batch_of(self, key: Hashable) -> KeptBatch | None:
        return self._of.get(key)

    def width_if_joined(self, keys: list[Hashable], offsets: list[int]) -> int:
        """At most how many positions each row of a batch of `keys` (holding `offsets`) would hold."""
        return max([b.width for b in self.touched(keys)] + offsets)

    def touched(self, keys: list[Hashable]) -> list[KeptBatch]:
        """The batches these requests' rows are in, each once."""
        return list({id(b): b for b in (self._of.get(k) for k in keys) if b is not None}.values())

    def detach(self, key: Hashable) -> list[KVCache] | None:
        """Take a request out of its batch; its own caches per owned layer (None: it was in none)."""
        batch = self._of.pop(key, None)
        return None if batch is None else batch.take_out([key], extract=True)[key]

    def discard(self, key: Hashable) -> None:
        """Take a request out of its batch without keeping its caches (it is dropped)."""
        batch = self._of.pop(key, None)
        if batch is not None:
            batch.take_out([key], extract=False)

    def adopt(self, keys: list[Hashable], caches: list[BatchKVCache]) -> KeptBatch:
        """A batch these requests (in no batch) were just prefilled into, kept as it is (Shard.prefill_batch)."""
        batch = KeptBatch(list(keys), caches)
        for k in keys:
            self._of[k] = batch
        return batch

    def batch_for(self, keys: list[Hashable], own: dict[Hashable, list[KVCache]]) -> tuple[KeptBatch, dict]:
        """The batch of exactly `keys`, kept if one is, else gathered.

        `own`: the caches per owned layer of each key in no batch. Returns the batch and the
        caches of the requests that had to leave it (in a batch, not in this pass): they go on
        with their own caches again.
        """
        wanted = set(keys)
        touched = self.touched(keys)
        if len(touched) == 1 and set(touched[0].members) == wanted:
            self.reused += 1
            return touched[0], {}
        base = max(touched, key=lambda b: len(wanted.intersection(b.members)), default=None)
        left, joining = {}, {k: own[k] for k in keys if k not in self._of}
        for batch in touched:
            if batch is base:
                leaving = [m for m in batch.members if m not in wanted]
                left = batch.take_out(leaving, extract=True)
                for k in leaving:
                    del self._of[k]
            else:
                moving = [m for m in batch.members if m in wanted]
                joining.update(batch.take_out(moving, extract=True))
        if base is None:
            base = KeptBatch(list(joining), _merge(list(joining.values()), len(next(iter(joining.values())))))
        elif joining:
            base.put_in(joining)
        for k in keys:
            self._of[k] = base
        return base, left
