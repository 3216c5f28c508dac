"""A stage holds a long prompt's later chunks back while other requests' decode steps are due, never
longer than a few times what the last chunk took (stage/chunk_hold.py)."""

from __future__ import annotations

import time

import numpy as np

from swarm.engine.sampling import SamplingParams
from swarm.stage.chunk_hold import HOLD_CHUNKS, ChunkHold
from swarm.transport.messages import Forward


def chunk(pos: int, length: int = 64, rid: str = "long") -> Forward:
    return Forward.of_tokens(rid, "p1", pos, "entry", None, list(np.arange(length) % 100))


def step(pos: int, rid: str = "short") -> Forward:
    return Forward.of_tokens(rid, "p1", pos, "entry", SamplingParams(), [7])


def test_later_chunks_wait_while_another_requests_step_is_due():
    hold = ChunkHold(min_period_s=0.2, min_hold_s=0.1)
    assert hold.until(chunk(64)) is None  # nobody decodes: go
    hold.served(chunk(64), took_s=1.0)  # a chunk took 1 s here: one may be held a few times that
    hold.served(step(40), took_s=0.01)
    assert hold.until(chunk(0)) is None and hold.until(step(41)) is None  # a first chunk, a step: never held
    until = hold.until(chunk(128))
    assert until is not None and until <= time.monotonic() + 2 * 0.2  # two periods after the step
    assert hold.until(chunk(128, rid="short")) is None  # a request's own steps do not hold its chunks
    time.sleep(0.5)
    assert hold.until(chunk(128)) is None  # the step is overdue: the request ended or went quiet
    assert hold.held == 1


def test_a_held_chunk_waits_no_longer_than_a_few_chunks_take():
    hold = ChunkHold(min_period_s=10.0, min_hold_s=0.1)
    hold.served(chunk(64), took_s=0.1)
    hold.served(step(40), took_s=0.01)
    first = hold.until(chunk(128))
    assert first is not None and first <= time.monotonic() + HOLD_CHUNKS * 0.1
    time.sleep(HOLD_CHUNKS * 0.1 + 0.05)
    hold.served(step(41), took_s=0.01)  # still decoding
    assert hold.until(chunk(128)) is None  # held its longest: it goes, however busy
    assert hold.until(chunk(192)) is not None  # the next chunk waits its own turn
    hold.forget(("entry", "short"))
    assert hold.until(chunk(192)) is None
