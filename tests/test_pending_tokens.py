"""The entry node never takes a late answer from an abandoned plan or step as the current token."""

from __future__ import annotations

import asyncio

import pytest

from swarm.entry.pending_tokens import PendingTokens
from swarm.entry.pipeline import PipelineBroken
from swarm.transport.messages import Error, Token


async def test_only_the_awaited_plan_and_position_resolve():
    pending = PendingTokens()
    fut = pending.expect("r1", "planB", at=50)
    pending.resolve(Token("r1", "planA", 50, 7))  # the old plan's late answer
    pending.resolve(Token("r1", "planB", 49, 8))  # an earlier step's late answer
    pending.resolve(Error("r1", "planA", "unreachable", "old news"))
    assert not fut.done()
    pending.resolve(Token("r1", "planB", 50, 9))
    assert (await pending.wait("r1", fut, 1)).token.token == 9


async def test_errors_and_plan_changes_break_the_wait():
    pending = PendingTokens()
    fut = pending.expect("r1", "planA", at=3)
    pending.resolve(Error("r1", "planA", "plan_mismatch", "moved on"))
    with pytest.raises(PipelineBroken, match="plan_mismatch"):
        await pending.wait("r1", fut, 1)
    fut = pending.expect("r2", "planA", at=3)
    kept = pending.expect("r3", "planB", at=3)
    pending.break_all("the plan changed", keep_plans=frozenset({"planB"}))
    with pytest.raises(PipelineBroken):
        await pending.wait("r2", fut, 1)
    assert not kept.done()


async def test_a_silent_pipeline_times_out():
    pending = PendingTokens()
    fut = pending.expect("r1", "planA", at=1)
    with pytest.raises(PipelineBroken, match="no token"):
        await pending.wait("r1", fut, 0.05)
    await asyncio.sleep(0)


async def test_answers_of_an_earlier_attempt_neither_resolve_nor_break_the_replay():
    pending = PendingTokens()
    fut = pending.expect("r1", "planA", at=64, attempt=1)
    pending.resolve(Token("r1", "planA", 64, 0))  # the first attempt's answer to the same chunk
    pending.resolve(Error("r1", "planA", "cache", "cache holds 0 positions, frame starts at 4096"))
    assert not fut.done()
    pending.resolve(Token("r1", "planA", 64, 0, attempt=1))
    assert (await pending.wait("r1", fut, 1)).token.attempt == 1
