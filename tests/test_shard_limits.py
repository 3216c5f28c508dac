"""What a shard may be fed and hold, on real tiny shards: token ids within its embedding, positions
within the context, chunks of at most MAX_CHUNK, hidden states of its width (engine/input_limits.py);
requests kept per entry, so none restarts or frees another's; caps on cached requests and KV bytes
per entry and in total (engine/cache_budget.py)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from swarm.engine.cache_budget import CacheFull, CacheLimits
from swarm.engine.input_limits import MAX_CHUNK
from swarm.engine.model_bytes import measure_model_bytes
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import CacheMismatch, ShardRunner
from swarm.backend import CPU_PREFILL_CHUNK, GPU_PREFILL_CHUNK
from swarm.node.config import MAX_PREFILL_CHUNK, MIN_PREFILL_CHUNK


@pytest.fixture(scope="module")
def shards(llama):
    path = llama
    return load_shard(path, 0, 3, mx.float32), load_shard(path, 3, 6, mx.float32), measure_model_bytes(path, mx.float32)


def ids(*tokens: int) -> bytes:
    return np.asarray(tokens, np.int32).tobytes()


def test_a_first_shard_takes_ids_of_its_vocabulary_within_the_context(shards):
    limits = shards[0].input_limits(4096)
    assert (limits.vocab, limits.hidden) == (384, None)
    assert limits.refusal(0, (1, 2), ids(0, 383)) is None
    for bad in (384, 999_999, 100_000_000, -1):
        assert "outside the vocabulary of 384" in limits.refusal(0, (1, 1), ids(bad))
        assert "outside the vocabulary" in limits.refusal(5, (1, 3), ids(1, bad, 2))
    assert "context of 4096" in limits.refusal(0, (1, 8192), ids(*[1] * 8192))
    assert "context of 4096" in limits.refusal(4090, (1, 10), ids(*[1] * 10))
    assert "at most 2048" in limits.refusal(0, (1, 2049), ids(*[1] * 2049))
    # the entry never sends a chunk a stage refuses, whatever --prefill-chunk says
    assert MIN_PREFILL_CHUNK <= CPU_PREFILL_CHUNK <= GPU_PREFILL_CHUNK <= MAX_PREFILL_CHUNK == MAX_CHUNK


def test_a_later_shard_takes_hidden_states_of_its_width(shards):
    limits = shards[1].input_limits(4096)
    assert (limits.vocab, limits.hidden) == (None, 64)
    assert limits.refusal(3, (1, 1, 64), bytes(256)) is None
    assert "width 32; this model's width is 64" in limits.refusal(3, (1, 1, 32), bytes(128))


def test_requests_are_kept_per_entry(shards):
    runner = ShardRunner(shards[0], context=4096)
    x = mx.array([[1, 2, 3]])
    runner.forward("r", x, 0, entry="a")
    runner.forward("r", x, 0, entry="b")  # the same id from another entry: its own request, not a restart
    runner.forward("r", mx.array([[4]]), 3, entry="a")  # a's request is where a left it
    with pytest.raises(CacheMismatch):
        runner.forward("r", mx.array([[4]]), 4, entry="b")
    assert not runner.release("r", "c") and runner.active_requests == 2  # c holds no request "r"
    assert sorted(runner.holders("r")) == ["a", "b"]
    assert runner.release("r", "a") and runner.release("r", "b") and runner.active_requests == 0
    with pytest.raises(CacheMismatch):  # a request that was never started holds nothing
        runner.forward("s", x, 3, entry="a")
    assert runner.active_requests == 0 and runner.kv_bytes == 0


def test_cached_requests_are_capped_per_entry_and_in_total(shards):
    runner = ShardRunner(shards[0], CacheLimits(requests=5, requests_per_entry=3), context=4096)
    one = mx.array([[1]])
    for i in range(3):
        runner.forward(f"a{i}", one, 0, entry="a")
    with pytest.raises(CacheFull, match="one entry may have"):
        runner.forward("a3", one, 0, entry="a")
    runner.forward("a0", one, 0, entry="a")  # a restart of one it holds is no new request
    runner.forward("b0", one, 0, entry="b")
    runner.forward("b1", one, 0, entry="b")
    with pytest.raises(CacheFull, match="most requests it caches"):
        runner.forward("c0", one, 0, entry="c")
    runner.release("a1", "a")
    runner.forward("c0", one, 0, entry="c")
    assert runner.active_requests == 5


def test_kv_bytes_are_capped_per_entry_and_in_total(shards):
    _, second, sizes = shards
    context = 256  # (a small context keeps the test quick; the caps scale with it)
    limits = CacheLimits.for_layers(sizes.caches, 3, 6, context)
    per_position = limits.bytes_per_position
    assert per_position == 3 * 2 * 2 * 16 * 4  # three layers' keys and values: 2 heads of 16 floats each
    assert limits.kv_bytes_per_entry == 2 * context * per_position and limits.kv_bytes == 4 * context * per_position
    runner = ShardRunner(second, limits, context=context)
    chunk = mx.zeros((1, context // 2, 64))
    for rid in ("a", "b"):  # two whole contexts
        runner.forward(rid, chunk, 0, entry="e1")
        runner.forward(rid, chunk, context // 2, entry="e1")
    assert runner.kv_bytes == 2 * context * per_position
    with pytest.raises(CacheFull, match="KV cache"):
        runner.forward("c", mx.zeros((1, 1, 64)), 0, entry="e1")
    for rid in ("c", "d"):  # another entry's two contexts fill the stage
        runner.forward(rid, chunk, 0, entry="e2")
        runner.forward(rid, chunk, context // 2, entry="e2")
    with pytest.raises(CacheFull, match="this stage's caches"):
        runner.forward("x", mx.zeros((1, 1, 64)), 0, entry="e3")
    held = runner.kv_bytes
    runner.release("a", "e1")
    assert runner.kv_bytes == held - context * per_position
    assert runner.release_idle(0.0) and runner.kv_bytes == 0 and runner.active_requests == 0
