"""How many of a request's prompt chunks the entry keeps out (entry/swarm_pipeline.py): a prompt alone at
its entry fills its plan (one chunk per stage, and one travelling), so no stage waits for a chunk's trip;
beside another request of the same entry it keeps two out, so the other's steps meet few chunks."""

from __future__ import annotations

import asyncio

import pytest

from partitioner import Plan
from partitioner.model import ModelSpec, Stage
from swarm.engine.sampling import SamplingParams
from swarm.entry.hop_timing import HopTiming
from swarm.entry.own_requests import OwnRequests
from swarm.entry.pending_tokens import PendingTokens
from swarm.entry.run_ahead import RunAhead
from swarm.entry.swarm_pipeline import PROMPT_CHUNKS_OUT, SwarmPipeline
from swarm.transport.messages import Forward, Token

pytestmark = pytest.mark.timeout(30)
PLAN = Plan(ModelSpec(6, 1), "balanced", (Stage("s1", 0, 2), Stage("s2", 2, 4), Stage("s3", 4, 6)), (), 0.0, "p1")
CHUNK = 16


class HeldAnswers:
    """An outbox whose stages answer only when the test says so (event loop)."""

    def __init__(self, pending: PendingTokens) -> None:
        self.pending, self.sent, self.answered = pending, [], []

    def post(self, node_id: str, forward: Forward) -> None:
        self.sent.append(forward)

    def answer_oldest(self) -> None:
        forward = self.sent[len(self.answered)]
        self.answered.append(forward)
        self.pending.resolve(Token(forward.rid, forward.plan_id, forward.pos + forward.length, 0, 0, None,
                                   forward.attempt))

    def post_release(self, *args, **kwargs) -> None:
        pass


async def _send_prompt(p: SwarmPipeline, rid: str, chunks: int) -> None:
    for i in range(chunks):
        await p.forward(rid, list(range(CHUNK)), i * CHUNK, None)


async def _chunks_sent_before_any_answer(outbox: HeldAnswers, p: SwarmPipeline, rid: str) -> int:
    task = asyncio.create_task(_send_prompt(p, rid, 10))
    await asyncio.sleep(0.2)
    sent = sum(1 for f in outbox.sent if f.rid == rid)
    task.cancel()
    return sent


def _pipeline() -> tuple[HeldAnswers, SwarmPipeline, OwnRequests]:
    pending, own = PendingTokens(), OwnRequests()
    outbox = HeldAnswers(pending)
    return outbox, SwarmPipeline(PLAN, "entry", outbox, pending, 20.0, HopTiming(), RunAhead("entry"), own), own


async def test_a_prompt_alone_at_its_entry_keeps_a_chunk_per_stage_and_one_more_out() -> None:
    outbox, p, _ = _pipeline()
    assert await _chunks_sent_before_any_answer(outbox, p, "long") == len(PLAN.stages) + 1


async def test_beside_another_request_of_its_entry_a_prompt_keeps_two_chunks_out() -> None:
    outbox, p, own = _pipeline()
    own.begin("short", PLAN)
    assert await _chunks_sent_before_any_answer(outbox, p, "long") == PROMPT_CHUNKS_OUT


async def test_a_prompt_drops_to_two_chunks_out_once_another_request_comes_and_each_answer_lets_one_more_go() -> None:
    outbox, p, own = _pipeline()
    task = asyncio.create_task(_send_prompt(p, "long", 10))
    await asyncio.sleep(0.1)
    assert len(outbox.sent) == len(PLAN.stages) + 1
    own.begin("short", PLAN)  # a short chat came to this entry
    for _ in range(len(PLAN.stages) + 1 - PROMPT_CHUNKS_OUT):
        outbox.answer_oldest()
        await asyncio.sleep(0.05)
        assert len(outbox.sent) == len(PLAN.stages) + 1  # the chunks out drain to two before the next leaves
    outbox.answer_oldest()
    await asyncio.sleep(0.05)
    assert len(outbox.sent) == len(PLAN.stages) + 2
    own.end("short")
    outbox.answer_oldest()
    await asyncio.sleep(0.05)
    assert len(outbox.sent) - len(outbox.answered) == len(PLAN.stages) + 1  # alone again: the plan fills
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_short_prompt_alone_goes_out_whole_with_its_sampled_step_before_any_answer() -> None:
    outbox, p, _ = _pipeline()
    await asyncio.wait_for(_send_prompt(p, "chat", 3), 1.0)
    step = asyncio.create_task(p.forward("chat", [5], 3 * CHUNK, SamplingParams(temperature=0.0)))
    await asyncio.sleep(0.1)
    assert [f.length for f in outbox.sent] == [CHUNK] * 3 + [1]
    step.cancel()
