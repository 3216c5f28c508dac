"""A stage's prompt cache (engine/prompt_cache.py): a request that starts from the caches a finished
request left gives the tokens and log-probabilities a cold run gives, for every family the zoo runs
exactly, split 1-, 2- and 3-way; a stage that cannot start from exactly the prefix says so.

ShardRunners chained in this process, as test_model_families.py does. A cold run is fed the same
positions in the same pieces (the first turn's prompt chunks, its generated tokens one by one, then
the second turn's rest), so the comparison is as strict as that file's.
"""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx
import pytest
from model_zoo import FAMILIES

from swarm.engine import families
from swarm.engine.prompt_cache import PromptCacheMiss
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TURN1 = [(i * 37) % 380 + 3 for i in range(30)]
MORE = [(i * 53) % 370 + 5 for i in range(14)]  # the next turn's new tokens
NEW_TOKENS = 6
SPLITS = [[6], [2, 4], [1, 3, 2]]
CHUNKS1 = [13, 16, 1]  # turn 1's prompt pieces (the last one is the sampled step)
EXACT = [f for f in FAMILIES if f not in families.REFUSED]
BUDGET = 64 << 20
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="session")
def zoo(random_model):
    """The zoo's model of a family, as tests/test_model_families.py builds it."""
    return lambda family: random_model(family, seed=1)


def runners(path: Path, sizes: list[int], budget: int = BUDGET) -> list[ShardRunner]:
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    return [ShardRunner(load_shard(path, a, b), prompt_cache_bytes=budget) for a, b in zip(bounds, bounds[1:])]


def run(stages: list[ShardRunner], rid: str, tokens: list[int], pos: int, prefix: list[int] | None = None):
    x = mx.array([tokens])
    for stage in stages:
        x = stage.forward(rid, x, pos, prefix=prefix)
    return x


def turn(stages, rid: str, history: list[int], pieces: list[int], start: int = 0,
         prefix: list[int] | None = None) -> tuple[list[int], list[mx.array], int]:
    """Feed history[start:] in `pieces` (the first from `prefix`'s caches when given), then decode greedily.
    Returns the tokens, their log-probabilities and the positions the caches hold."""
    assert sum(pieces) == len(history) - start
    pos = start
    for i, n in enumerate(pieces):
        logits = run(stages, rid, history[pos:pos + n], pos, prefix if i == 0 else None)
        pos += n
    tokens, logprobs = [], []
    for k in range(NEW_TOKENS):
        logprobs.append(logits - mx.logsumexp(logits))
        tokens.append(int(mx.argmax(logits)))
        if k + 1 < NEW_TOKENS:
            logits = run(stages, rid, [tokens[-1]], pos)
            pos += 1
    return tokens, logprobs, pos


def assert_same(got, want, what: str) -> None:
    assert got[0] == want[0], what
    worst = max(float(mx.max(mx.abs(a - b))) for a, b in zip(got[1], want[1]))
    assert worst < 1e-4, f"{what}: log-probabilities differ by {worst}"


def release(stages, rid: str, keep: list[int] | None) -> None:
    for stage in stages:
        stage.release(rid, keep=keep)


def first_turn(stages) -> tuple[list[int], list[int]]:
    """Turn 1, released with what its caches hold; returns (those tokens, the next turn's history)."""
    tokens, _, held = turn(stages, "t1", TURN1, CHUNKS1)
    history = TURN1 + tokens
    release(stages, "t1", history[:held])
    return history[:held], history + MORE


@pytest.mark.parametrize("family", EXACT)
def test_a_continuation_from_the_cache_equals_a_cold_run(zoo, family):
    path = zoo(family)
    if family in families.PIECES_MATTER:
        return _assert_pieces_matter(path, family)
    for sizes in SPLITS:
        stages = runners(path, sizes)
        kept, history = first_turn(stages)
        rest = [len(history) - 1 - len(kept), 1]
        cached = turn(stages, "t2", history, rest, start=len(kept), prefix=kept)
        assert all(s.prompt_stats().hits == 1 for s in stages), f"{family} {sizes}: every stage starts from its cache"
        assert sum(s.prompt_stats().tokens_saved for s in stages) == len(kept) * len(stages)
        cold_stages = runners(path, sizes, budget=0)
        same_pieces = turn(cold_stages, "c", history, CHUNKS1[:-1] + [1] * (len(kept) - sum(CHUNKS1[:-1])) + rest)
        assert_same(cached, same_pieces, f"{family} split {sizes}: cached vs cold, same pieces")
        cold = turn(cold_stages, "c2", history, [len(history) - 1, 1])
        assert cached[0] == cold[0], f"{family} split {sizes}: cached vs a cold prefill of the whole history"


def _assert_pieces_matter(path: Path, family: str) -> None:
    """A family listed as one whose output depends on the pieces a prompt comes in: it still does, and its
    stages keep nothing, so every request runs cold."""
    stages = runners(path, [2, 4])
    kept, history = first_turn(stages)
    assert all(s.prompt_stats().entries == 0 for s in stages)
    with pytest.raises(PromptCacheMiss):
        run(stages, "t2", history[len(kept):-1], len(kept), prefix=kept)
    whole = turn(runners(path, [6], budget=0), "w", history, [len(history) - 1, 1])
    pieces = turn(runners(path, [6], budget=0), "p", history, [len(kept), len(history) - 1 - len(kept), 1])
    assert whole[0] != pieces[0] or max(float(mx.max(mx.abs(a - b))) for a, b in zip(whole[1], pieces[1])) > 1e-3, \
        f"{family}: its output no longer depends on the pieces; take it off families.PIECES_MATTER"


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt_oss", "qwen3_next"])
def test_a_prompt_sharing_part_of_a_kept_sequence(zoo, family):
    """Only the first 20 tokens are shared: trimmable caches start from 20 positions; a window that wrapped
    or a recurrent state cannot be cut back, and the stage says so (the entry then runs it cold)."""
    path = zoo(family)
    stages = runners(path, [2, 4])
    first_turn(stages)
    history = TURN1[:20] + MORE
    try:
        cached = turn(stages, "t2", history, [len(history) - 21, 1], start=20, prefix=TURN1[:20])
    except PromptCacheMiss:
        assert family in ("gpt_oss", "qwen3_next"), f"{family}'s caches can be cut back"
        return
    assert family in ("llama", "qwen3")
    cold = turn(runners(path, [2, 4], budget=0), "c", history, [13, 7, len(history) - 21, 1])
    assert_same(cached, cold, f"{family}: part of a kept prefix")


def test_eviction_under_a_small_budget_keeps_the_most_recent(zoo):
    path = zoo("llama")
    [probe] = runners(path, [6])
    turn([probe], "p", TURN1, CHUNKS1)
    release([probe], "p", TURN1)
    one = probe.prompt_stats().bytes
    stages = runners(path, [6], budget=int(one * 2.5))
    prompts = [[t + k for t in TURN1] for k in range(4)]
    for k, prompt in enumerate(prompts):
        turn(stages, f"r{k}", prompt, CHUNKS1)
        release(stages, f"r{k}", prompt)
    stats = stages[0].prompt_stats()
    assert stats.entries == 2 and stats.bytes <= int(one * 2.5)
    for old in prompts[:2]:
        with pytest.raises(PromptCacheMiss):
            run(stages, "again", old[-1:], len(old) - 1, prefix=old[:-1])
    turn(stages, "hit", prompts[3] + MORE, [len(MORE) - 1, 1], start=len(prompts[3]), prefix=prompts[3])
    assert stages[0].prompt_stats().hits == 1


def test_a_restarted_stage_misses_and_drops_the_requests_later_frames(zoo):
    path = zoo("llama")
    stages = runners(path, [2, 4])
    kept, history = first_turn(stages)
    stages[1] = runners(path, [2, 4])[1]  # the second stage restarted: its cache is empty
    with pytest.raises(PromptCacheMiss) as missed:
        run(stages, "t2", history[len(kept):-1], len(kept), prefix=kept)
    assert not missed.value.quiet
    with pytest.raises(PromptCacheMiss) as later:  # the rest of the attempt, in flight: dropped without a word
        run(stages, "t2", history[-1:], len(history) - 1)
    assert later.value.quiet
    # the entry's cold retry starts afresh everywhere
    cold = turn(stages, "t2", history, [len(history) - 1, 1])
    assert cold[0] == turn(runners(path, [2, 4], budget=0), "c", history, [len(history) - 1, 1])[0]


def test_a_budget_of_zero_keeps_nothing(zoo):
    stages = runners(zoo("llama"), [6], budget=0)
    first_turn(stages)
    assert stages[0].prompt_stats().entries == 0


@pytest.mark.parametrize("sizes", [[6], [2, 4]])
def test_requests_from_prefixes_of_different_lengths_decode_in_one_batch(zoo, sizes):
    """Three requests, two of them from kept prefixes of different lengths, one cold, decode side by side:
    through kept batches (llama batches) their tokens are each one's alone."""
    path = zoo("llama")
    stages = runners(path, sizes)
    long_kept, long_history = first_turn(stages)
    short = TURN1[:22]
    turn(stages, "s", short, [21, 1])
    release(stages, "s", short)
    starts = {"a": (long_history, len(long_kept)), "b": (short + MORE, len(short)), "c": (TURN1 + MORE, 0)}
    logits = {}
    for rid, (history, kept) in starts.items():  # each prompt's rest, alone (a prefixed one is no decode step)
        logits[rid] = run(stages, rid, history[kept:], kept, prefix=history[:kept] if kept else None)
    pos = {rid: len(h) for rid, (h, _) in starts.items()}
    batched = {rid: [int(mx.argmax(logits[rid]))] for rid in starts}
    for _ in range(NEW_TOKENS - 1):
        items = [(rid, mx.array([[batched[rid][-1]]]), pos[rid], GREEDY) for rid in starts]
        for stage in stages:
            outs = stage.decode_batch(items)
            items = [(rid, out, p, GREEDY) for (rid, _, p, _), out in zip(items, outs)]
        for rid, token, _, _ in items:
            batched[rid].append(token)
            pos[rid] += 1
    assert sum(s.batches.reused for s in stages) > 0, "the rows ran as kept batches"
    alone = runners(path, sizes, budget=0)
    for rid, (history, _) in starts.items():
        assert batched[rid] == turn(alone, rid, history, [len(history) - 1, 1])[0], rid
    # released while its rows are in a kept batch: its own rows are kept, and a next turn starts from them
    history, _ = starts["b"]
    kept = history + batched["b"][:-1]
    release(stages, "b", kept)
    again = kept + [batched["b"][-1]] + MORE
    cached = turn(stages, "b2", again, [len(again) - 1 - len(kept), 1], start=len(kept), prefix=kept)
    assert cached[0] == turn(alone, "b2", again, [len(again) - 1, 1])[0]


def test_a_release_naming_more_positions_than_held_keeps_nothing(zoo):
    """An entry that stopped mid-prefill (or lies) names tokens the caches do not hold: nothing is kept."""
    [stage] = runners(zoo("llama"), [6])
    run([stage], "r", TURN1[:10], 0)
    stage.release("r", keep=TURN1)
    assert stage.prompt_stats().entries == 0 and stage.active_requests == 0
    run([stage], "r2", TURN1[:20], 0)
    stage.release("r2", keep=TURN1[:20])
    assert stage.prompt_stats().entries == 1
