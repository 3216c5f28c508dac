"""The node inbox's and the stage's checks with their real parts (MLX thread, lane, listener, a tiny model's last
three layers) and real peers over loopback: a frame from the stage before it that this stage cannot
serve earns the request's entry an Error saying why; the same frame from anyone else earns nobody
anything; releases free only the sender's own requests."""

from __future__ import annotations

import asyncio
import time

import mlx.core as mx
import numpy as np
import pytest
from helpers import eventually
from peer_nodes import HOST, SWARM, PeerNode

from partitioner import ModelSpec, Plan, Stage
from swarm.engine.model_bytes import measure_model_bytes
from swarm.engine.sampling import SamplingParams
from swarm.engine.worker import MlxWorker
from swarm.entry.entry_inbox import EntryInbox
from swarm.entry.own_requests import OwnRequests
from swarm.entry.pending_tokens import PendingTokens
from swarm.entry.run_ahead import RunAhead
from swarm.node.inbox import NodeInbox
from swarm.node.sender_rules import SenderRules
from swarm.stage.stage_host import StageHost
from swarm.stage.stage_service import StageService
from swarm.transport.lane import DataLane
from swarm.transport.links import PeerLinks
from swarm.transport.listener import PeerListener
from swarm.transport.messages import Error, Forward, Release, Token

pytestmark = pytest.mark.timeout(120)

PLAN = Plan(ModelSpec(6, 1000), "balanced", (Stage("prev", 0, 3), Stage("us", 3, 6)), (), 0.0, "p1")
GREEDY = SamplingParams()


@pytest.fixture
async def stage(llama):
    """Node "us", the last stage of PLAN, with "prev" (stage 0 and the entry) and a stranger as peers."""
    addresses: dict[str, tuple[str, int]] = {}
    worker = MlxWorker()
    links = PeerLinks("us")
    lane = DataLane("us", SWARM, links, worker.watch, worker.post, addresses.get)
    listener = PeerListener("us", SWARM, HOST, 0, links, lane, lambda: None)
    path = llama
    sizes = await worker.run(measure_model_bytes, path, mx.float32)
    host = StageHost(path, mx.float32, worker, context=4096, layer_caches=sizes.caches)
    await host.assign(PLAN, (3, 6))
    rules = SenderRules("us", host.known_plan, lambda n: n in addresses, OwnRequests(), 384)
    service = StageService(host, lane, worker)
    entry = EntryInbox("us", worker, PendingTokens(), RunAhead("us"), asyncio.get_running_loop(),
                       service.mlx_send_or_fail, lane.mlx_send)
    inbox = NodeInbox(lane, worker, rules, service, entry)
    inbox.start()
    await listener.start()
    addresses["us"] = (HOST, listener.port)
    prev = await PeerNode("prev", addresses).start()
    stranger = await PeerNode("stranger", addresses).start()
    yield service, prev, stranger
    await prev.stop()
    await stranger.stop()
    await inbox.stop()
    await listener.stop()
    worker.close()


def hidden(rid: str, pos: int, width: int, length: int = 2, entry: str = "prev") -> Forward:
    h = np.zeros((1, length, width), np.float32)
    return Forward(rid, "p1", pos, 3, entry, GREEDY, "float32", h.shape, h.tobytes())


async def answer(node: PeerNode, timeout: float = 10.0):
    return (await node.received_async(1, timeout))[0]


async def test_the_entry_learns_why_a_frame_from_the_previous_stage_was_refused(stage):
    service, prev, _ = stage
    await prev.send("us", hidden("wide", 0, 32))
    sender, error = await answer(prev)
    assert sender == "us" and isinstance(error, Error) and error.kind == "protocol"
    assert "width 32; this model's width is 64" in error.message
    await prev.send("us", hidden("late", 4090, 64, length=10))
    _, error = await answer(prev)
    assert isinstance(error, Error) and "context of 4096" in error.message
    await prev.send("us", hidden("ok", 0, 64))
    _, token = await answer(prev)
    assert isinstance(token, Token) and token.rid == "ok" and token.at == 2


async def test_the_same_frames_from_anyone_else_earn_nobody_anything(stage):
    service, prev, stranger = stage
    before = service.refusals.count
    await stranger.send("us", hidden("wide", 0, 32))
    await stranger.send("us", hidden("ok", 0, 64))
    await stranger.send("us", hidden("ok", 0, 64, entry="stranger"))
    await eventually(lambda: service.refusals.count >= before + 3, 10, "the stranger's frames refused")
    await asyncio.sleep(0.2)
    assert prev.nothing_received() and stranger.nothing_received()
    assert service.host.runner.active_requests == 0


async def test_releases_free_only_the_senders_own_requests(stage):
    service, prev, stranger = stage
    await prev.send("us", hidden("mine", 0, 64))
    await answer(prev)
    await stranger.send("us", Release("mine"))
    await prev.send("us", hidden("mine", 2, 64, length=1))  # goes on where it was: nothing was freed
    _, token = await answer(prev)
    assert isinstance(token, Token) and token.at == 3
    await prev.send("us", Release("mine"))
    await prev.send("us", hidden("mine", 3, 64, length=1))  # its entry let it go: dropped, no answer
    await prev.send("us", hidden("mine", 3, 64, length=1)._replace(attempt=1))  # a new attempt is not
    _, error = await answer(prev)
    assert isinstance(error, Error) and error.kind == "cache" and error.attempt == 1
    assert "cache holds 0 positions" in error.message and prev.nothing_received()


async def test_a_prompt_chunk_is_answered_once_read_with_its_attempt(stage):
    """The last stage tells the entry each prompt chunk it read (the entry sends the next ones as these
    come: entry/swarm_pipeline.py); a frame of an attempt older than one seen is dropped unanswered."""
    service, prev, _ = stage
    chunk = hidden("long", 0, 64, length=4)._replace(sampling=None)
    await prev.send("us", chunk)
    _, read = await answer(prev)
    assert isinstance(read, Token) and (read.rid, read.at, read.attempt) == ("long", 4, 0)
    await prev.send("us", chunk._replace(attempt=2))  # a replay: the first attempt's caches go
    _, read = await answer(prev)
    assert (read.at, read.attempt) == (4, 2)
    await prev.send("us", chunk._replace(pos=4))  # the first attempt's next chunk, late: dropped
    await prev.send("us", hidden("long", 4, 64, length=1)._replace(attempt=2))
    _, token = await answer(prev)
    assert isinstance(token, Token) and (token.at, token.attempt) == (5, 2)
    assert prev.nothing_received()
    await prev.send("us", Release("long", attempt=2))
    await eventually(lambda: service.host.runner.active_requests == 0, 10, "the request freed")


async def test_a_new_prompt_waits_for_one_chunk_of_a_prompt_whose_chunks_are_queued(stage):
    """An entry keeps several chunks of a prompt out (entry/swarm_pipeline.py): however many of them are
    queued here, a new request's first chunk goes right after the chunk under way, then the rest."""
    service, prev, _ = stage
    chunks = [hidden("long", pos, 64, length=4)._replace(sampling=None) for pos in range(0, 16, 4)]
    newcomer = hidden("new", 0, 64, length=4)._replace(sampling=None)
    service.worker.post(time.sleep, 1.0)  # (all of them queue while our MLX thread is busy)
    for frame in chunks + [newcomer]:
        await prev.send("us", frame)
    answers = [m for _, m in await prev.received_async(len(chunks) + 1, 20.0)]
    assert [(m.rid, m.at) for m in answers] == [("long", 4), ("new", 4), ("long", 8), ("long", 12), ("long", 16)]
