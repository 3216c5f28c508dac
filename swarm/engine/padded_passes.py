"""A shard's passes over left-padded batches of rows on mlx-lm's BatchKVCache (mixed into Shard).

Only for shards that take padded batches (Shard.takes_padded_batches: every layer a KVCache whose
BatchKVCache mask hides the padding): new prompts' first chunks in one pass (`prefill_batch`), prompts
after kept prefixes of any lengths (`prefill_batch_after`), a kept batch's decode step (`decode_kept`).
MLX thread only.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from . import row_streams
from .shard_caches import ShardCaches


class PaddedPasses:
    """Mixed into Shard: uses its `_forward`, `_cache_slots`, `_last_edge`, `range`, `model`, `own_caches`."""

    def prefill_batch(self, x: mx.array, left_padding: list[int]) -> tuple[mx.array, list[BatchKVCache]]:
        """The first positions of B prompts as one left-padded pass (only when takes_padded_batches).

        x: ids (B, L) or hidden states (B, L, D), row b's first left_padding[b] positions padding.
        Runs the model's own forward on mlx-lm's BatchKVCache (its mask hides the padding). Returns
        the hidden states (B, L, D) (the last shard: the last position's logits) and the batch's
        caches, one BatchKVCache per owned layer: kept as they are for the rows' next decode steps
        (kept_batches.py), or split into each row's own (`rows_of`).
        """
        def caches(start: int, end: int) -> list[BatchKVCache]:
            return [BatchKVCache(left_padding[start:end]) for _ in self._cache_slots]
        return self._padded_pass(x, caches)

    def prefill_batch_after(self, x: mx.array, lengths: list[int],
                            kept: list[list[KVCache]]) -> tuple[mx.array, list[BatchKVCache]]:
        """The next positions of B prompts, each after the positions its own caches already hold (a kept
        prefix, of any length, 0 included), as one pass (only when takes_padded_batches), as mlx-lm's
        BatchGenerator prompts rows with history: the rows' caches merged left-padded
        (`BatchKVCache.merge`, each row's held positions ending together), x right-padded (row b's
        positions first, lengths[b] of them), the padding then rolled to the left (`finalize`).

        kept: each row's own caches, one per owned layer (in layer order). Returns the hidden states
        (B, L, D), row b's first lengths[b] positions its own (the last shard: each row's last position's
        logits), and the batch's caches as prefill_batch does.
        """
        right_padding = [x.shape[1] - n for n in lengths]

        def caches(start: int, end: int) -> list[BatchKVCache]:
            merged = [BatchKVCache.merge([row[i] for row in kept[start:end]]) for i in range(len(self._cache_slots))]
            for c in merged:
                c.prepare(right_padding=right_padding[start:end])
            return merged
        return self._padded_pass(x, caches, finish=lambda batch: [c.finalize() for c in batch],
                                 ends=[n - 1 for n in lengths])

    def _padded_pass(self, x: mx.array, caches, finish=None,
                     ends: list[int] | None = None) -> tuple[mx.array, list[BatchKVCache]]:
        """One pass over a padded batch: `caches(start, end)` the BatchKVCaches of rows [start, end),
        `finish` what the caches need once the pass ran, `ends` each row's last real position (None:
        the last); cut by row groups where that pays."""
        groups = row_streams.row_groups(x.shape[0])
        if groups:
            out, batch = self._prefill_by_row_groups(x, caches, groups, finish, ends)
        else:
            batch = caches(0, x.shape[0])
            out = self._forward_rows(x, batch, ends)
            if finish is not None:
                finish(batch)
        return (out[:, -1] if self.range.is_last else out), batch

    def _forward_rows(self, x: mx.array, batch: list[BatchKVCache], ends: list[int] | None) -> mx.array:
        self._last_edge.rows_end = None if ends is None else mx.array(ends)
        try:
            return self._forward(x, self._batch_slots(batch))
        finally:
            self._last_edge.rows_end = None

    def _prefill_by_row_groups(self, x: mx.array, caches, groups: list[tuple[int, int]], finish,
                               ends: list[int] | None) -> tuple[mx.array, list[BatchKVCache]]:
        """_padded_pass's pass, each group of rows on a CPU stream of its own (row_streams.py), its
        caches then joined into one batch (`BatchKVCache.extend`: a concatenation where the groups
        hold as many positions, left padding where they do not)."""
        parts = []
        for (start, end), stream in zip(groups, row_streams.streams(len(groups))):
            with mx.stream(stream):
                group = caches(start, end)
                parts.append((self._forward_rows(x[start:end], group, ends and ends[start:end]), group))
        row_streams.evaluate_in_lockstep([list(layer) for layer in zip(*(group for _, group in parts))],
                                         [out for out, _ in parts])
        if finish is not None:
            for _, group in parts:
                finish(group)
        batch = parts[0][1]
        for _, group in parts[1:]:
            for joined, more in zip(batch, group):
                joined.extend(more)
        return mx.concatenate([out for out, _ in parts]), batch

    def rows_of(self, batch: list[BatchKVCache], n: int) -> list[ShardCaches]:
        """Each of a batch's `n` rows as its own caches, without the padding (`BatchKVCache.extract`)."""
        return [self.own_caches([b.extract(r) for b in batch]) for r in range(n)]

    def decode_kept(self, x: mx.array, batch: list[BatchKVCache]) -> mx.array:
        """One new position for each row of a kept batch (kept_batches.py; only when takes_padded_batches):
        x is ids (B, 1) or hidden states (B, 1, D) in the batch's row order, `batch` one
        BatchKVCache per owned layer. The model's own forward, its mask hiding each row's padding.
        Returns hidden states (B, 1, D), or on the last shard the logits (B, vocab)."""
        out = self._forward(x, self._batch_slots(batch))
        return out[:, -1] if self.range.is_last else out

    def _batch_slots(self, batch: list[BatchKVCache]) -> list:
        """The model's cache list for a batch: every layer is a KVCache here (UnrolledDecode), so a
        layer we do not own answers with one we do (they have seen the same positions)."""
        slots = [batch[0]] * len(self.model.layers)
        for b, i in zip(batch, self._cache_slots):
            slots[i] = b
        return slots
