"""Decode batches kept across steps (engine/kept_batches.py), against each request run alone.

A stage keeps one mlx-lm BatchKVCache per layer for the requests of a decode pass, and uses
it as it is when the same requests come back (in any order); a request that joins is merged
in, one that leaves (released, run alone, replayed from position 0) is filtered out with its
own caches extracted. Every step here is checked against a runner that serves each request
alone, so a row mixed up with another, a cache extracted wrong or a padding left in a row
fails. Tokens are compared (the kept batch's attention runs over the padded width, which
may round differently from a lone request's with an optimized BLAS: docs/architecture.md, Batched decode).
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from swarm.engine.cache_budget import CacheLimits
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from helpers import NARROW_SHAPE

GREEDY = SamplingParams()
MODEL = {"family": "qwen3", **NARROW_SHAPE}
PROMPTS = [[5, 9, 13, 2, 7, 1, 3, 9, 2], [3, 3], [11, 4, 8, 1, 9, 6, 2, 10, 5, 7, 7, 8, 2], [4, 6, 8, 10, 12]]


class Pair:
    """The same requests on a runner that keeps batches and on one that runs each alone."""

    def __init__(self, path, bounds, prompts, width: int = 128, limits: CacheLimits | None = None):
        self.single = ShardRunner(load_shard(path, *bounds))
        self.kept = ShardRunner(load_shard(path, *bounds), limits=limits)
        self.first, self.last = bounds[0] == 0, bounds[1] is None
        self.width, self.prompts = width, {f"r{i}": p for i, p in enumerate(prompts)}
        self.pos, self.token = {}, {}
        for rid in self.prompts:
            self.start(rid)

    def given(self, rid: str, n: int, at: int) -> mx.array:
        if self.first:
            prompt = self.prompts[rid]
            return mx.array([prompt[at:at + n]]) if at < len(prompt) - 1 else mx.array([[self.token[rid]]])
        return mx.random.normal((1, n, self.width), key=mx.random.key(1000 * int(rid[1:]) + at))

    def start(self, rid: str) -> None:
        n = len(self.prompts[rid]) - 1
        for runner in (self.single, self.kept):
            runner.forward(rid, self.given(rid, n, 0), 0)
        self.pos[rid], self.token[rid] = n, self.prompts[rid][-1]

    def step(self, rids: list[str], batched: bool = True) -> None:
        items = [(rid, self.given(rid, 1, self.pos[rid]), self.pos[rid], GREEDY if self.last else None)
                 for rid in rids]
        expected = [self.single.forward(*item) for item in items]
        got = self.kept.decode_batch(items) if batched else [self.kept.forward(*item) for item in items]
        for rid, g, e in zip(rids, got, expected):
            assert not isinstance(g, Exception), g
            if self.last:
                assert g == e, f"{rid} at {self.pos[rid]}"
                self.token[rid] = e
            else:
                assert mx.allclose(g, e, atol=1e-4, rtol=1e-4), f"{rid} at {self.pos[rid]}"
            self.pos[rid] += 1


@pytest.mark.parametrize("bounds", [(0, None), (0, 2), (2, 5), (5, None)])
def test_kept_batch_follows_joins_leaves_and_any_row_order(model, bounds) -> None:
    pair = Pair(model, bounds, PROMPTS)
    kept = pair.kept
    pair.step(["r0", "r1", "r2"])
    batch = kept.batches.batch_of(("", "r0"))
    assert batch is not None and sorted(batch.members) == [("", "r0"), ("", "r1"), ("", "r2")]
    assert all(kept._requests[("", r)].caches is None for r in ("r0", "r1", "r2")), "held once, in the batch"
    pair.step(["r2", "r0", "r1"])  # the same requests in another order: the same batch, as it is
    pair.step(["r1", "r2", "r0"])
    assert kept.batches.batch_of(("", "r1")) is batch and batch.width == len(PROMPTS[2]) + 2
    pair.step(["r3", "r1", "r0", "r2"])  # one joins
    assert kept.batches.batch_of(("", "r3")) is batch and len(batch.members) == 4
    pair.step(["r0", "r1", "r2", "r3"])
    pair.step(["r1"], batched=False)  # one runs alone: extracted, the others stay batched
    assert ("", "r1") not in kept.batches and kept._requests[("", "r1")].caches is not None
    pair.step(["r0", "r2", "r3"])  # a pass without it: the batch as it is now
    assert kept.batches.batch_of(("", "r0")) is batch and len(batch.members) == 3
    pair.step(["r1", "r3"])  # a pass across a batch and a loose request: the batch keeps those in the pass
    assert kept.batches.batch_of(("", "r3")) is kept.batches.batch_of(("", "r1")) is batch
    assert ("", "r0") not in kept.batches and kept._requests[("", "r0")].caches is not None
    pair.step(["r0", "r2"])
    other = kept.batches.batch_of(("", "r0"))
    assert other is not batch and other is kept.batches.batch_of(("", "r2"))
    pair.step(["r0", "r1", "r2", "r3"])  # the two gathered into one
    assert kept.release("r2")  # released: filtered out
    assert ("", "r2") not in kept.batches and len(kept.batches.batch_of(("", "r0")).members) == 3
    pair.step(["r3", "r0", "r1"])
    pair.start("r0")  # replayed from position 0: starts afresh, out of the batch
    assert ("", "r0") not in kept.batches
    pair.step(["r0", "r1", "r3"])
    for _ in range(3):
        pair.step(["r3", "r1", "r0"])
    for rid in ("r0", "r1", "r3"):
        kept.release(rid)
    assert kept.active_requests == 0 and kept.budget.positions == 0 and kept.budget.requests == 0


def test_kept_batch_counts_its_padding_and_stays_within_the_caps(model) -> None:
    """Each row of a kept batch holds the batch's width: counted against its entry; a pass whose padding
    would pass a cap runs on the requests' own caches instead (still served, still exact)."""
    per_position = 10
    pair = Pair(model, (0, None), PROMPTS[:3], limits=CacheLimits(bytes_per_position=per_position))
    kept = pair.kept
    own = sum(len(p) - 1 for p in PROMPTS[:3])
    assert kept.kv_bytes == own * per_position
    pair.step(["r0", "r1", "r2"])
    width = len(PROMPTS[2])  # every row holds the longest's positions
    assert kept.kv_bytes == 3 * width * per_position
    kept.release("r2")  # the longest leaves: the batch narrows to the next longest
    assert kept.kv_bytes == 2 * len(PROMPTS[0]) * per_position
    kept.release("r0")
    assert kept.kv_bytes == len(PROMPTS[1]) * per_position and kept.budget.positions == len(PROMPTS[1])

    cap = (own + 9) * per_position + 20  # three steps of own positions fit, the padding does not
    tight = Pair(model, (0, None), PROMPTS[:3], limits=CacheLimits(bytes_per_position=per_position,
                                                                       kv_bytes_per_entry=cap))
    for _ in range(3):
        tight.step(["r0", "r1", "r2"])
    assert ("", "r0") not in tight.kept.batches, "padding past the cap: no kept batch"
    assert tight.kept.kv_bytes == (own + 9) * per_position


def test_default_model_batched_tokens_equal_each_request_alone(default_model) -> None:
    """The default model, whole, 4 requests with joins and a leave: the same greedy tokens as alone."""
    prompts = [[1, 504, 3458, 282, 253, 1167, 28, 2], [1, 11283, 288, 1789, 30], [1, 2683, 314, 253, 4366, 47, 30],
               [1, 10480, 253, 1751, 3717, 335, 3459, 9290, 28, 1615, 284]]
    pair = Pair(default_model.path, (0, None), prompts, width=576)
    for _ in range(6):
        pair.step(["r0", "r1", "r2"])
    for _ in range(6):
        pair.step(["r3", "r2", "r1", "r0"])
    pair.kept.release("r1")
    for _ in range(6):
        pair.step(["r0", "r2", "r3"])
