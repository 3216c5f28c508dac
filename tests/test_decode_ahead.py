"""A whole-model stage's next decode step built before the token is read (engine/decode_ahead.py), against
the same requests on a runner that does not: the same tokens, whatever comes next (the asked step, another
token or position, a batch, a release), and the caps count what the caches hold."""

from __future__ import annotations

import mlx.core as mx
import pytest

from swarm.backend import Backend
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
PROMPT = [5, 9, 13, 2, 7, 1, 3, 9, 2]


MODEL = dict(family="llama", n_layers=4, seed=3)  # conftest's `model` fixture builds it


@pytest.fixture
def pair(model):
    return ShardRunner(load_shard(model, 0, None)), ShardRunner(load_shard(model, 0, None), decode_ahead=True)


def _start(runner: ShardRunner, rid: str, sampling: SamplingParams) -> int:
    return runner.forward(rid, mx.array([PROMPT]), 0, sampling)


def _step(runner: ShardRunner, rid: str, token: int, pos: int, sampling: SamplingParams) -> int:
    return runner.forward(rid, mx.array([[token]], mx.int32), pos, sampling)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_steps_ahead_give_the_tokens_a_step_at_a_time_gives(pair, sampling):
    plain, ahead = pair
    a, b = _start(plain, "r", sampling), _start(ahead, "r", sampling)
    assert a == b
    pos = len(PROMPT)
    for _ in range(12):
        assert ahead._requests[("", "r")].ahead is not None  # the next step is under way
        a, b = _step(plain, "r", a, pos, sampling), _step(ahead, "r", b, pos, sampling)
        assert a == b, pos
        pos += 1
    # the caps count the step under way too: one position more than the request asked for
    assert ahead._requests[("", "r")].offset == plain._requests[("", "r")].offset + 1
    assert ahead.budget.positions == plain.budget.positions + 1
    assert ahead.release("r") and ahead.budget.positions == 0 and ahead.active_requests == 0


def test_a_step_nobody_asked_for_is_rolled_back(pair):
    plain, ahead = pair
    t = _start(plain, "r", GREEDY)
    assert _start(ahead, "r", GREEDY) == t
    pos = len(PROMPT)
    other = (t + 1) % 256  # the entry sends another token (e.g. a request forced elsewhere): not the step ahead
    assert _step(plain, "r", other, pos, GREEDY) == _step(ahead, "r", other, pos, GREEDY)
    # a replay from position 0 and then the rest
    assert _start(plain, "r", GREEDY) == _start(ahead, "r", GREEDY)
    a = b = _step(plain, "r", t, pos, GREEDY)
    assert _step(ahead, "r", t, pos, GREEDY) == a
    # the sampling changed (another request's rules would not reuse the step): computed afresh
    a, b = _step(plain, "r", a, pos + 1, SAMPLED), _step(ahead, "r", b, pos + 1, SAMPLED)
    assert a == b
    assert ahead.budget.positions == plain.budget.positions + 1


def test_a_batch_takes_its_rows_back_from_steps_ahead(pair):
    plain, ahead = pair
    tokens = {}
    for rid in ("x", "y"):
        t = _start(plain, rid, GREEDY)
        assert _start(ahead, rid, GREEDY) == t
        tokens[rid] = t
    pos = len(PROMPT)
    items = [(rid, mx.array([[tokens[rid]]], mx.int32), pos, GREEDY) for rid in ("x", "y")]
    assert plain.decode_batch(items) == ahead.decode_batch(items)
    assert all(st.ahead is None for st in ahead._requests.values())
    assert ahead.budget.positions == plain.budget.positions


def test_only_gpus_decode_ahead():
    assert Backend("cuda", "x", 1, 1).decode_ahead and Backend("metal", "x", 1, 1).decode_ahead
    assert not Backend("cpu", "x").decode_ahead


def test_a_request_kept_for_its_prompt_leaves_no_step_ahead_in_the_kept_caches(model):
    """Released with `keep` (the prompt cache), the caches hold the request's own positions only: a later
    request from that prefix gives what a runner without steps ahead gives."""
    plain = ShardRunner(load_shard(model, 0, None), prompt_cache_bytes=64 << 20)
    ahead = ShardRunner(load_shard(model, 0, None), prompt_cache_bytes=64 << 20, decode_ahead=True)
    history = {}
    for runner in (plain, ahead):
        seen = list(PROMPT)
        t = _start(runner, "r", GREEDY)
        for pos in range(len(PROMPT), len(PROMPT) + 5):
            seen.append(t)
            t = _step(runner, "r", t, pos, GREEDY)
        assert runner.release("r", keep=seen)
        history[id(runner)] = (seen, t)
    assert history[id(plain)] == history[id(ahead)]
    seen, t = history[id(plain)]
    again = [r.forward("r2", mx.array([[t]], mx.int32), len(seen), GREEDY, prefix=seen) for r in (plain, ahead)]
    assert again[0] == again[1]
