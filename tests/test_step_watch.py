"""The entry's overdue-step watch (entry/swarm_pipeline.py): a sampled step whose token is late has its
plan's stages suspected, again each overdue period while it stays late, and the step still takes its
token when it comes; a step answered in time leaves no timer behind that could suspect anyone later."""

from __future__ import annotations

import asyncio

import pytest

from partitioner import Plan
from partitioner.model import ModelSpec, Stage
from swarm.engine.sampling import SamplingParams
from swarm.entry.hop_timing import HopTiming
from swarm.entry.own_requests import OwnRequests
from swarm.entry.pending_tokens import PendingTokens
from swarm.entry.pipeline import PipelineBroken
from swarm.entry.run_ahead import RunAhead
from swarm.entry.swarm_pipeline import SwarmPipeline
from swarm.transport.messages import Forward, Token

pytestmark = pytest.mark.timeout(30)
PLAN = Plan(ModelSpec(4, 1), "balanced", (Stage("s1", 0, 2), Stage("s2", 2, 4)), (), 0.0, "p1")
OVERDUE_S = 0.2


class AnswerAfter:
    """An outbox whose stages answer each step after `delay_s` (event loop)."""

    def __init__(self, pending: PendingTokens, delay_s: float) -> None:
        self.pending, self.delay_s = pending, delay_s

    def post(self, node_id: str, forward: Forward) -> None:
        token = Token(forward.rid, forward.plan_id, forward.pos + forward.length, 42, 0, None, forward.attempt)
        asyncio.get_running_loop().call_later(self.delay_s, self.pending.resolve, token)

    def post_release(self, *args, **kwargs) -> None:
        pass


class Watch:
    def __init__(self) -> None:
        self.told: list[str] = []

    def overdue_after(self, plan: Plan, positions: int) -> float:
        return OVERDUE_S

    def step_overdue(self, plan: Plan, why: str) -> None:
        self.told.append(why)


def pipeline(delay_s: float, watch: Watch, token_timeout: float = 20.0) -> SwarmPipeline:
    pending = PendingTokens()
    return SwarmPipeline(PLAN, "entry", AnswerAfter(pending, delay_s), pending, token_timeout, HopTiming(),
                         RunAhead("entry"), OwnRequests(), watch=watch)


async def test_a_late_token_is_reported_overdue_and_still_taken() -> None:
    watch = Watch()
    token = await pipeline(OVERDUE_S * 1.5, watch).forward("r1", [1], 0, SamplingParams(temperature=0.0))
    assert token == 42
    assert len(watch.told) == 1 and "request r1" in watch.told[0]


async def test_a_token_that_stays_late_is_reported_again_each_overdue_period() -> None:
    # A stage that answered the first check may stop reading after it (or its check was skipped, as it
    # had just been probed): once is not enough, or the step waits out the token timeout.
    watch = Watch()
    token = await pipeline(OVERDUE_S * 5.5, watch).forward("r1", [1], 0, SamplingParams(temperature=0.0))
    assert token == 42
    assert len(watch.told) >= 3, watch.told
    assert "after 0.2 s" in watch.told[0] and "after 0.4 s" in watch.told[1], watch.told


async def test_steps_answered_in_time_leave_no_overdue_timer_behind() -> None:
    watch = Watch()
    p = pipeline(0.0, watch)
    for i in range(20):
        assert await p.forward("r1", [1], i, SamplingParams(temperature=0.0)) == 42
    await asyncio.sleep(OVERDUE_S * 5)  # past every step's overdue time
    assert watch.told == []


async def test_a_token_that_never_comes_is_overdue_then_times_out() -> None:
    watch = Watch()
    p = pipeline(3600.0, watch, token_timeout=OVERDUE_S * 5)
    with pytest.raises(PipelineBroken, match="no token within"):
        await p.forward("r1", [1], 0, SamplingParams(temperature=0.0))
    assert 1 <= len(watch.told) <= 4, watch.told
