"""The entry's next decode step started on arrival of the token (entry/run_ahead.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from swarm.engine.sampling import SamplingParams
from swarm.entry.pending_tokens import PendingTokens
from swarm.entry.pipeline import PipelineBroken
from swarm.entry.run_ahead import RunAhead
from swarm.transport.messages import Error, Token

GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, seed=1)


def test_only_the_armed_token_starts_the_next_step_once() -> None:
    ahead = RunAhead("entry")
    ahead.arm("r1", "planA", 10, GREEDY, frozenset({2}), "stage0")
    assert ahead.mlx_next_step(Token("r1", "planB", 10, 5)) is None  # another plan's late answer
    assert ahead.mlx_next_step(Token("r1", "planA", 9, 5)) is None  # an earlier step's
    assert ahead.mlx_next_step(Token("r2", "planA", 10, 5)) is None  # another request
    step = ahead.mlx_next_step(Token("r1", "planA", 10, 5))
    assert step is not None and ahead.mlx_next_step(Token("r1", "planA", 10, 5)) is None
    f = step.forward
    assert (step.to, f.rid, f.plan_id, f.pos, f.start, f.entry, f.sampling) == \
        ("stage0", "r1", "planA", 10, 0, "entry", GREEDY)
    assert (f.dtype, f.shape) == ("int32", (1, 1))
    assert np.frombuffer(f.payload, dtype=np.int32).tolist() == [5]
    started = step.started
    assert ahead.started("r1", "planA", 10, [6]) is None  # not the step that was started
    ahead.mlx_next_step(Token("r1", "planA", 10, 5))
    ahead.arm("r1", "planA", 10, GREEDY, frozenset(), "stage0")
    ahead.mlx_next_step(Token("r1", "planA", 10, 5))
    assert ahead.started("r1", "planA", 10, [5]) >= started
    assert ahead.started("r1", "planA", 10, [5]) is None  # taken once
    assert f.ids is None, "a plain request's step carries no token ids"
    ahead.arm("r1", "planA", 11, GREEDY, frozenset(), "stage0", with_ids=True)
    ruled = ahead.mlx_next_step(Token("r1", "planA", 11, 6)).forward
    assert ruled.token_ids() == [6] and ruled.rules is None, "a request with rules: its ids, not its rules again"


def test_a_stop_token_or_a_forgotten_request_starts_nothing() -> None:
    ahead = RunAhead("entry")
    ahead.arm("r1", "planA", 4, GREEDY, frozenset({2}), "stage0")
    assert ahead.mlx_next_step(Token("r1", "planA", 4, 2)) is None  # EOS: the request ends
    ahead.arm("r1", "planA", 5, GREEDY, frozenset(), "stage0")
    ahead.forget("r1")
    assert ahead.mlx_next_step(Token("r1", "planA", 5, 7)) is None


async def test_a_token_that_comes_before_its_wait_is_kept() -> None:
    pending = PendingTokens()
    first = pending.expect("r1", "planA", at=3)
    early = pending.expect("r1", "planA", at=4)  # armed ahead
    pending.resolve(Token("r1", "planA", 3, 7))
    pending.resolve(Token("r1", "planA", 4, 8))  # before anyone waits for it
    assert (await pending.wait("r1", first, 1)).token.token == 7
    assert pending.expect("r1", "planA", at=4) is early
    assert (await pending.wait("r1", early, 1)).token.token == 8


async def test_errors_and_forget_reach_every_wait_of_a_request() -> None:
    pending = PendingTokens()
    a, b = pending.expect("r1", "planA", at=3), pending.expect("r1", "planA", at=4)
    pending.resolve(Error("r1", "planA", "cache", "lost"))
    for fut in (a, b):
        with pytest.raises(PipelineBroken, match="cache"):
            await pending.wait("r1", fut, 1)
    c = pending.expect("r2", "planA", at=9)
    pending.forget("r2")
    await asyncio.sleep(0)
    assert c.cancelled()
