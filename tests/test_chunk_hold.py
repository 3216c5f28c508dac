"""A stage holds a long prompt's later chunks back while other requests decode, for a bounded time."""

from __future__ import annotations

import time

import numpy as np

from swarm.engine.sampling import SamplingParams
from swarm.stage.chunk_hold import ChunkHold
from swarm.transport.messages import Forward


def chunk(pos: int, length: int = 64, rid: str = "long") -> Forward:
    return Forward.of_tokens(rid, "p1", pos, "entry", None, list(np.arange(length) % 100))


def step(pos: int, rid: str = "short") -> Forward:
    return Forward.of_tokens(rid, "p1", pos, "entry", SamplingParams(), [7])


def test_later_chunks_wait_for_decode_steps_at_most_the_hold():
    hold = ChunkHold(after_step_s=0.5, max_s=1.0)
    assert hold.until(chunk(64)) is None  # nobody decodes: go
    hold.stepped(chunk(0))  # (a prompt chunk is no decode step)
    assert hold.until(chunk(64)) is None
    hold.stepped(step(40))
    assert hold.until(chunk(0)) is None and hold.until(step(41)) is None  # a first chunk, a step: never held
    until = hold.until(chunk(64))
    assert until is not None and until <= time.monotonic() + 0.5
    assert hold.held == 1
    time.sleep(0.3)
    hold.stepped(step(41))  # still decoding: held on, but never past max_s from the first hold
    later = hold.until(chunk(64))
    assert until < later <= until - 0.5 + 1.0 + 0.05
    assert hold.held == 1


def test_a_chunk_goes_once_the_steps_stop_or_the_hold_runs_out():
    hold = ChunkHold(after_step_s=0.2, max_s=10.0)
    hold.stepped(step(40))
    assert hold.until(chunk(64)) is not None
    time.sleep(0.25)
    assert hold.until(chunk(64)) is None  # no step for after_step_s
    short = ChunkHold(after_step_s=10.0, max_s=0.2)
    short.stepped(step(40))
    assert short.until(chunk(64)) is not None
    time.sleep(0.25)
    short.stepped(step(41))
    assert short.until(chunk(64)) is None  # held its max_s: it goes, however busy
    assert short.until(chunk(128)) is not None  # the next chunk waits its own turn
