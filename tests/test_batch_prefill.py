"""Prompts of new requests that queue together at a stage share one left-padded pass (ShardRunner.prefill_batch).

The padded pass runs the model's own forward on mlx-lm's BatchKVCache; its rows differ from a
lone prefill in the last bits (padding changes the attention's reduction), so this compares
greedy tokens and hidden states to a tolerance, and checks that each row's caches then decode
exactly like a lone request's caches would (same positions, no padding left in them), and that
prompts prefilled together decode on the batch they were prefilled in (engine/kept_batches.py).
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from swarm.engine import row_streams
from swarm.engine.cache_budget import CacheLimits
from swarm.engine.prompt_cache import PromptCacheMiss
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import CacheMismatch, ShardRunner
from helpers import NARROW_SHAPE

GREEDY = SamplingParams()


@pytest.fixture(scope="module", params=["qwen3", "llama", "qwen2"])
def family_model(request, random_model):
    return request.param, random_model(request.param, **NARROW_SHAPE)


@pytest.mark.parametrize("bounds", [(0, None), (0, 2), (2, 5), (5, None)])
def test_padded_prompt_pass_equals_each_prompt_alone(family_model, bounds) -> None:
    family, model = family_model
    single, batched = (ShardRunner(load_shard(model, *bounds)) for _ in range(2))
    first, last = bounds[0] == 0, bounds[1] is None
    prompts = [[5, 9, 13, 2, 7, 1, 3, 9], [3, 3], [11, 4, 8, 1, 9, 6, 2, 10, 5, 7, 7, 8]]

    def given(i: int, n: int, at: int) -> mx.array:
        if first:
            return mx.array([prompts[i][at:at + n]])
        return mx.random.normal((1, n, 128), key=mx.random.key(10 * i + at))
    items = [(f"r{i}", given(i, len(p), 0)) for i, p in enumerate(prompts)]
    alone = [single.forward(rid, x, 0) for rid, x in items]
    together = batched.prefill_batch(items, ["", "", ""])
    for a, t in zip(alone, together):
        assert a.shape == t.shape
        assert mx.allclose(a, t, atol=1e-4, rtol=1e-4), f"{family} {bounds}"
    tokens = [int(mx.argmax(a)) if last else 1 for a in alone]
    for step in range(6):  # the caches hold each prompt's positions, no padding
        for runner in (single, batched):
            outs = [runner.forward(f"r{i}", mx.array([[t]]) if first else given(i, 1, len(p) + step),
                                   len(p) + step, GREEDY if last else None)
                    for i, (p, t) in enumerate(zip(prompts, tokens))]
            if runner is single:
                expected = outs
            elif last:
                assert outs == expected, f"{family} {bounds} step {step}"
            else:
                assert all(mx.allclose(o, e, atol=1e-4, rtol=1e-4) for o, e in zip(outs, expected))
        if last:
            tokens = expected
    assert batched.active_requests == 3
    out = batched.prefill_batch([("r0", given(0, 3, 0)), ("big", given(1, 2, 0))], ["", ""])
    assert not isinstance(out[0], Exception) and batched.forward("r0", given(0, 1, 3), 3) is not None, \
        "a prompt again from position 0 starts its request afresh"
    small = ShardRunner(load_shard(model, *bounds), context=4)
    out = small.prefill_batch([("r0", given(0, 8, 0)), ("r1", given(1, 2, 0))], ["", ""])
    assert isinstance(out[0], CacheMismatch) and not isinstance(out[1], Exception)


@pytest.mark.parametrize("bounds", [(0, None), (2, 5)])
def test_prompts_prefilled_together_decode_on_the_batch_they_were_prefilled_in(family_model, bounds) -> None:
    """No split into each row's caches and merge back at the first decode step (it cost a cohort of 8
    on the default model 60-140 ms more than a later step): the prefill's batch is kept, its padding counted."""
    family, model = family_model
    first, last = bounds[0] == 0, bounds[1] is None
    prompts = [[5, 9, 13, 2, 7, 1, 3, 9], [3, 3], [11, 4, 8, 1, 9, 6, 2, 10, 5, 7, 7, 8]]
    per_position = 10

    def given(i: int, n: int, at: int, token: int = 1) -> mx.array:
        if first:
            return mx.array([prompts[i][at:at + n]]) if at < len(prompts[i]) else mx.array([[token]])
        return mx.random.normal((1, n, 128), key=mx.random.key(10 * i + at))

    single = ShardRunner(load_shard(model, *bounds))
    batched = ShardRunner(load_shard(model, *bounds), limits=CacheLimits(bytes_per_position=per_position))
    items = [(f"r{i}", given(i, len(p), 0)) for i, p in enumerate(prompts)]
    alone = [single.forward(rid, x, 0) for rid, x in items]
    batched.prefill_batch(items, ["", "", ""])
    keys = [("", f"r{i}") for i in range(3)]
    batch = batched.batches.batch_of(keys[0])
    assert batch is not None and batch.members == keys, family
    assert all(batched._requests[k].caches is None for k in keys), "held once, in the batch"
    width = max(len(p) for p in prompts)
    assert batched.kv_bytes == 3 * width * per_position, "every row counted the batch's width"
    tokens = [int(mx.argmax(a)) if last else 1 for a in alone]
    for step in range(4):
        rows = [(f"r{i}", given(i, 1, len(p) + step, t), len(p) + step, GREEDY if last else None)
                for i, (p, t) in enumerate(zip(prompts, tokens))]
        expected = [single.forward(*row) for row in rows]
        got = batched.decode_batch(rows[::-1], ["", "", ""])[::-1]  # any row order
        if last:
            assert got == expected, f"{family} step {step}"
            tokens = expected
        else:
            assert all(mx.allclose(g, e, atol=1e-4, rtol=1e-4) for g, e in zip(got, expected)), family
        assert batched.batches.batch_of(keys[1]) is batch
    assert batched.batches.reused == 4, "the prefill's batch as it was, every step"

    own = sum(len(p) for p in prompts)  # a cap the prompts fit but their padding does not
    tight = ShardRunner(load_shard(model, *bounds),
                        limits=CacheLimits(bytes_per_position=per_position, kv_bytes_per_entry=(own + 2) * per_position))
    out = tight.prefill_batch(items, ["", "", ""])
    assert not any(isinstance(o, Exception) for o in out)
    assert keys[0] not in tight.batches and tight._requests[keys[0]].caches is not None, "each on its own caches"
    assert tight.kv_bytes == own * per_position


@pytest.mark.parametrize("bounds", [(0, None), (2, 5)])
@pytest.mark.parametrize("groups", [[(0, 2), (2, 4)], [(0, 1), (1, 3), (3, 4)]])
def test_a_prompt_pass_cut_by_rows_across_cpu_streams_is_the_whole_pass_bit_for_bit(family_model, bounds, groups,
                                                                                       monkeypatch) -> None:
    """engine/row_streams.py: each group of rows on its own CPU stream, evaluated layer by layer, the
    caches joined into one batch; the same output and caches as one pass over all rows, and the same
    decode step on them."""
    family, model = family_model
    first, last = bounds[0] == 0, bounds[1] is None
    shard = load_shard(model, *bounds)
    pads, width = [0, 3, 1, 5], 9
    x = (mx.array([[3 + (7 * r + i) % 50 for i in range(width)] for r in range(4)]) if first
         else mx.random.normal((4, width, 128), key=mx.random.key(3)))
    step = mx.array([[5], [6], [7], [8]]) if first else mx.random.normal((4, 1, 128), key=mx.random.key(4))
    results = []
    for cut in ([], groups):
        monkeypatch.setattr(row_streams, "row_groups", lambda rows, cut=cut: cut)
        out, batch = shard.prefill_batch(x, pads)
        mx.eval(out, [(c.keys, c.values) for c in batch])
        results.append((out, batch, shard.decode_kept(step, batch)))
    (whole, whole_batch, whole_next), (cut_out, cut_batch, cut_next) = results
    assert whole.shape == cut_out.shape and mx.array_equal(whole, cut_out).item(), f"{family} {bounds}"
    for w, c in zip(whole_batch, cut_batch):
        assert c.left_padding.tolist() == w.left_padding.tolist() and c.offset.tolist() == w.offset.tolist()
        assert c._idx == w._idx and all(mx.array_equal(a, b).item() for a, b in zip(w.keys_and_values(),
                                                                                     c.keys_and_values()))
    assert mx.array_equal(whole_next, cut_next).item(), f"{family} {bounds}: the decode step on the joined batch"
    assert last or whole_next.shape == (4, 1, 128)


@pytest.mark.parametrize("bounds", [(0, None), (0, 2), (2, 5), (5, None)])
@pytest.mark.parametrize("cut", [[], [(0, 1), (1, 4)]], ids=["whole", "row-groups"])
def test_prompts_after_kept_prefixes_of_different_lengths_share_one_pass(family_model, bounds, cut,
                                                                         monkeypatch) -> None:
    """Requests that start from kept prefixes (prompt_cache.py) of different lengths, and one from
    position 0, in one pass (Shard.prefill_batch_after, as mlx-lm's BatchGenerator prompts rows with
    history), whole or cut by rows across CPU streams (row_streams.py: the groups' caches hold other
    prefix lengths): each row's output, logprobs and the tokens it decodes after equal its request
    run alone from the same prefix; the rows then decode on the batch they were prefilled in."""
    family, model = family_model
    monkeypatch.setattr(row_streams, "row_groups", lambda rows: cut if rows == 4 else [])
    first, last = bounds[0] == 0, bounds[1] is None
    kept = {"long": [(5 * k) % 40 + 2 for k in range(21)], "short": [(3 * k) % 40 + 3 for k in range(9)]}
    # (rid, its prefix, the rest of its prompt): a whole kept sequence, one cut back, none, another whole one
    rows = [("r0", kept["long"], [4, 9, 1, 7]), ("r1", kept["long"][:13], [8, 8, 2, 6, 5, 1, 3]),
            ("r2", None, [7, 3, 11, 2, 9, 6, 1, 1, 4, 12, 3]), ("r3", kept["short"], [2, 5])]

    def given(name: str, ids: list[int], at: int) -> mx.array:
        if first:
            return mx.array([ids])
        return mx.random.normal((1, len(ids), 128), key=mx.random.key(sum(map(ord, name)) * 100 + at))

    def runner() -> ShardRunner:
        stage = ShardRunner(load_shard(model, *bounds), prompt_cache_bytes=1 << 26)
        for name, ids in kept.items():  # the same inputs on both: the same kept caches
            stage.forward(name, given(name, ids, 0), 0)
            assert stage.release(name, keep=ids)
        return stage

    single, batched = runner(), runner()
    starts = [(rid, given(rid, rest, len(prefix or ())), prefix) for rid, prefix, rest in rows]
    alone = [single.forward(rid, x, len(prefix or ()), prefix=prefix) for rid, x, prefix in starts]
    together = batched.prefill_batch(starts, [""] * len(starts))
    for (rid, *_), a, t in zip(rows, alone, together):
        assert not isinstance(t, Exception), t
        assert a.shape == t.shape, f"{family} {bounds} {rid}"
        assert mx.allclose(a, t, atol=1e-4, rtol=1e-4), f"{family} {bounds} {rid}"
        if last:
            assert int(mx.argmax(a)) == int(mx.argmax(t))
            logprobs = [v - mx.logsumexp(v) for v in (a, t)]
            assert mx.allclose(*logprobs, atol=1e-4), f"{family} {bounds} {rid}: logprobs"
    assert batched.prompt_stats().hits == 3 and single.prompt_stats().hits == 3
    keys = [("", rid) for rid, *_ in rows]
    batch = batched.batches.batch_of(keys[0])
    assert batch is not None and batch.members == keys, "the rows decode on the batch of their pass"
    held = [len(prefix or ()) + len(rest) for _, prefix, rest in rows]
    assert batch.width == len(kept["long"]) + max(len(rest) for *_, rest in rows), \
        "prefixes end together, the rests' right padding rolled to the left"
    tokens = [int(mx.argmax(a)) if last else 1 for a in alone]
    for step in range(4):
        steps = [(rid, mx.array([[t]]) if first else given(rid, [0], n + step), n + step, GREEDY if last else None)
                 for (rid, *_), n, t in zip(rows, held, tokens)]
        expected = [single.forward(*s) for s in steps]
        got = batched.decode_batch(steps[::-1], [""] * len(steps))[::-1]
        if last:
            assert got == expected, f"{family} {bounds} step {step}"
            tokens = expected
        else:
            assert all(mx.allclose(g, e, atol=1e-4, rtol=1e-4) for g, e in zip(got, expected)), family
    assert batched.batches.reused == 4, "the pass's batch as it was, every step"

    lost = batched.prefill_batch([("m", given("m", [3, 4, 5], 9), [1] * 9), ("c", given("c", [3, 4], 0), None)],
                                 ["", ""])
    assert isinstance(lost[0], PromptCacheMiss) and not isinstance(lost[1], Exception), \
        "a prefix this stage does not keep misses; the row beside it goes on"
