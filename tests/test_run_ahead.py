"""The entry's next decode step started on arrival of the token (coordination/run_ahead.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from swarm.coordination import messages as msg
from swarm.coordination.pending_tokens import PendingTokens
from swarm.coordination.run_ahead import RunAhead
from swarm.inference.pipeline import PipelineBroken

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 1}


def test_only_the_armed_token_starts_the_next_step_once() -> None:
    ahead = RunAhead("entry")
    ahead.arm("r1", "planA", 10, GREEDY, frozenset({2}))
    assert ahead.next_step(msg.token("r1", "planB", 10, 5)) is None  # another plan's late answer
    assert ahead.next_step(msg.token("r1", "planA", 9, 5)) is None  # an earlier step's
    assert ahead.next_step(msg.token("r2", "planA", 10, 5)) is None  # another request
    step = ahead.next_step(msg.token("r1", "planA", 10, 5))
    assert step is not None and ahead.next_step(msg.token("r1", "planA", 10, 5)) is None
    h = step.header
    assert (h["t"], h["rid"], h["plan"], h["pos"], h["start"], h["entry"], h["sampling"]) == \
        ("fwd", "r1", "planA", 10, 0, "entry", GREEDY)
    assert (h["dtype"], h["shape"]) == ("int32", [1, 1])
    assert np.frombuffer(step.payload, dtype=np.int32).tolist() == [5]
    started = ahead.started_at("r1")
    assert ahead.started("r1", "planA", 10, [6]) is None  # not the step that was started
    ahead.next_step(msg.token("r1", "planA", 10, 5))
    ahead.arm("r1", "planA", 10, GREEDY, frozenset())
    ahead.next_step(msg.token("r1", "planA", 10, 5))
    assert ahead.started("r1", "planA", 10, [5]) >= started
    assert ahead.started("r1", "planA", 10, [5]) is None  # taken once


def test_a_stop_token_or_a_forgotten_request_starts_nothing() -> None:
    ahead = RunAhead("entry")
    ahead.arm("r1", "planA", 4, GREEDY, frozenset({2}))
    assert ahead.next_step(msg.token("r1", "planA", 4, 2)) is None  # EOS: the request ends
    ahead.arm("r1", "planA", 5, GREEDY, frozenset())
    ahead.forget("r1")
    assert ahead.next_step(msg.token("r1", "planA", 5, 7)) is None


async def test_a_token_that_comes_before_its_wait_is_kept() -> None:
    pending = PendingTokens()
    first = pending.expect("r1", "planA", at=3)
    early = pending.expect("r1", "planA", at=4)  # armed ahead
    pending.resolve(msg.token("r1", "planA", 3, 7))
    pending.resolve(msg.token("r1", "planA", 4, 8))  # before anyone waits for it
    assert (await pending.wait("r1", first, 1))["token"] == 7
    assert pending.expect("r1", "planA", at=4) is early
    assert (await pending.wait("r1", early, 1))["token"] == 8


async def test_errors_and_forget_reach_every_wait_of_a_request() -> None:
    pending = PendingTokens()
    a, b = pending.expect("r1", "planA", at=3), pending.expect("r1", "planA", at=4)
    pending.resolve(msg.error("r1", "planA", "cache", "lost"))
    for fut in (a, b):
        with pytest.raises(PipelineBroken, match="cache"):
            await pending.wait("r1", fut, 1)
    c = pending.expect("r2", "planA", at=9)
    pending.forget("r2")
    await asyncio.sleep(0)
    assert c.cancelled()
