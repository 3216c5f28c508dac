"""Issue 19's attacks by a peer, against a real two-node swarm on loopback: every frame is checked
against the plan, secret or not.

The swarm: two `swarm-node` processes (tiny llama, 3 + 3 layers, static peers, no mDNS); the
first stage is the entry of the victim's requests. The stranger is a real peer (tests/hostile_peer.py):
it is in both nodes' view (they were given it as a static peer; its model is another, so it is
never in a plan), says hello as itself and sends well-formed messages of the real protocol. It
learns the victim's request id as an attacker could before (the events stream published it) or
from the entry's debug log (it cannot now). Each attack runs beside a victim's greedy stream,
whose text must equal mlx-lm's, with no replay.
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import psutil
import pytest
from frame_attacker import HOST, Victim, start_stranger
from helpers import eventually, http_json
from reference import chat_prompt, reference_chat

from swarm.bench.cluster import LocalCluster, free_port, get_json
from swarm.engine.sampling import SamplingParams
from swarm.transport.messages import Error, Forward, Release, Token

pytestmark = pytest.mark.timeout(300)

VICTIM = [{"role": "user", "content": "Tell me a story about the sea"}]
VICTIM_TOKENS = 500
GREEDY = SamplingParams(0.0, 1.0, 0, 0)
EOS = 2  # the tiny models' end of sequence


@pytest.fixture(scope="module")
def stranger_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, llama, stranger_port):
    workdir = tmp_path_factory.mktemp("hostile-peers")
    # Stated speeds: a speed the nodes re-measured mid-stream could re-plan and replay the victim.
    args = ("--peer", f"{HOST}:{stranger_port}", "--recovery-timeout", "10", "--speed", "0.002")
    with LocalCluster(2, workdir, str(llama), log_level="DEBUG", extra_args=args) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def expected(llama):
    text, n = reference_chat(llama, VICTIM, VICTIM_TOKENS)
    assert n == VICTIM_TOKENS, "the victim's stream must run its whole length: the attacks run beside it"
    return text


@pytest.fixture(scope="module")
def prompt_len(llama) -> int:
    return len(chat_prompt(llama, VICTIM))


def plan_of(swarm) -> tuple[str, list[dict]]:
    status, topology = get_json(swarm.entry.url + "/v1/topology")
    assert status == 200, topology
    return topology["plan"]["id"], topology["plan"]["stages"]


def in_view(swarm, node_id: str) -> bool:
    for node in swarm.nodes:
        status, topology = get_json(node.url + "/v1/topology")
        if status != 200 or node_id not in {n["id"] for n in topology["nodes"]}:
            return False
    return True


@pytest.fixture
async def stranger(swarm, stranger_port):
    s = await start_stranger(swarm.swarm, stranger_port)
    for node in swarm.nodes:
        s.addresses[node.node_id] = (HOST, node.peer_port)
    try:
        await eventually(lambda: in_view(swarm, s.node_id), timeout=30,
                         what="the stranger in both nodes' view", blocking=True)
        yield s
    finally:
        await s.stop()


def by_id(swarm, node_id: str):
    return next(n for n in swarm.nodes if n.node_id == node_id)


async def victim_under_attack(swarm, attack, expected: str) -> Victim:
    """Run `attack(rid, victim)` (an async function, called until the victim's stream ends) beside an
    honest greedy stream; the stream must come out exactly as mlx-lm's, with no replay."""
    entry = swarm.entry
    victim = Victim(entry.url, VICTIM, VICTIM_TOKENS, entry.log).start()
    rid = await asyncio.to_thread(victim.request_id)
    rounds, give_up = 0, time.monotonic() + 60  # an undisturbed stream takes a few seconds
    while not victim.done and time.monotonic() < give_up:
        await attack(rid, victim)
        rounds += 1
        await asyncio.sleep(0.005)
    victim.wait(60)
    print(f"{rounds} rounds of attack during the victim's stream")
    assert victim.error is None, victim.error
    assert victim.text == expected
    assert victim.replays(rid) == []
    return victim


async def wait_answer(stranger, rid: str, timeout: float = 60.0):
    """The first token or error a node sent the stranger for its request `rid`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for sender, message in stranger.answers():  # (nodes ping the stranger too: link_meter.py)
            if getattr(message, "rid", None) == rid:
                return sender, message
        await asyncio.sleep(0.02)
    raise AssertionError(f"no answer for {rid} within {timeout:.0f} s")


# -- request ids: on nothing a stranger can read ---------------------------------------------
def test_request_ids_are_on_nothing_a_stranger_can_read(swarm, expected):
    """The events stream, topology and health of every node, read while a victim streams: none
    names its request id (the entry's own log does, for its operator)."""
    victim = Victim(swarm.entry.url, VICTIM, VICTIM_TOKENS, swarm.entry.log).start()
    rid = victim.request_id()
    seen = []
    while not victim.done:
        for node in swarm.nodes:
            for path in ("/health", "/v1/topology"):
                seen.append(json.dumps(get_json(node.url + path)[1]))
        time.sleep(0.05)
    victim.wait()
    assert victim.error is None and victim.text == expected
    assert victim.started_event is not None and "request_id" not in victim.started_event, victim.started_event
    print(f"request {rid[:8]}...: its started event {victim.started_event}; {len(seen)} topology/health bodies")
    assert not [body for body in seen + [json.dumps(victim.started_event)] if rid in body]


# -- tokens and errors: only from the plan's last stage, only for requests the entry started -----
@pytest.mark.parametrize("token", [100, EOS], ids=["token-sweep", "eos-sweep"])
async def test_a_token_sweep_cannot_write_into_a_victims_stream(swarm, stranger, expected, prompt_len, token):
    plan_id, _ = plan_of(swarm)

    async def sweep(rid, victim):
        at = prompt_len + victim.chunks - 2  # from about where the stream is, on
        await stranger.send_all(swarm.entry.node_id, [Token(rid, plan_id, p, token) for p in range(at, at + 40)])

    victim = await victim_under_attack(swarm, sweep, expected)
    assert victim.finish_reason == "length"


async def test_an_error_flood_forces_no_replay(swarm, stranger, expected):
    plan_id, stages = plan_of(swarm)

    async def flood(rid, victim):
        errors = [Error(rid, plan_id, kind, "flood") for kind in ("cache", "plan_mismatch", "protocol")]
        await stranger.send_all(swarm.entry.node_id, errors)

    await victim_under_attack(swarm, flood, expected)


# -- releases: only from the request's entry ------------------------------------------------
async def test_a_strangers_release_frees_no_victims_caches(swarm, stranger, expected):
    _, stages = plan_of(swarm)

    async def release(rid, victim):
        for stage in stages:
            await stranger.send_all(stage["node_id"], [Release(rid)])

    await victim_under_attack(swarm, release, expected)


# -- forwards: only from the previous stage, or into stage 0 from the entry it names ----------
async def test_a_forward_at_position_0_replaces_no_victims_caches(swarm, stranger, expected):
    plan_id, stages = plan_of(swarm)
    first, second = stages[0], stages[1]
    hidden = np.zeros((1, 4, 64), np.float32)

    async def restart(rid, victim):
        await stranger.send_all(first["node_id"], [
            Forward.of_tokens(rid, plan_id, 0, first["node_id"], None, [5, 6, 7]),  # as if from the entry
            Forward.of_tokens(rid, plan_id, 0, stranger.node_id, None, [5, 6, 7]),  # its own, same id
        ])
        await stranger.send_all(second["node_id"], [
            Forward(rid, plan_id, 0, second["start"], first["node_id"], None, "float32", hidden.shape,
                    hidden.tobytes())])

    victim = await victim_under_attack(swarm, restart, expected)
    # The stranger's own request under the victim's id (it is that one's entry) is its to free, once
    # its last restart has gone through stage 0 into stage 1.
    rid = await asyncio.to_thread(victim.request_id)
    await asyncio.sleep(1.0)
    for stage in stages:
        await stranger.send_all(stage["node_id"], [Release(rid)])


# -- what a frame says: token ids, positions, lengths, widths ---------------------------------
async def test_a_prefill_past_the_context_is_refused(swarm, stranger):
    plan_id, stages = plan_of(swarm)
    first = stages[0]["node_id"]
    await stranger.send_all(first, [Forward.of_tokens("long-1", plan_id, 0, stranger.node_id, GREEDY, [7] * 8192)])
    sender, answer = await wait_answer(stranger, "long-1")
    assert isinstance(answer, Error), answer
    assert sender == first and answer.kind == "protocol" and "context" in answer.message, answer
    await stranger.send_all(first, [Forward.of_tokens("late-1", plan_id, 4090, stranger.node_id, GREEDY, [7] * 10)])
    sender, answer = await wait_answer(stranger, "late-1")
    assert isinstance(answer, Error) and answer.kind == "protocol" and "context" in answer.message, answer


async def test_fake_requests_cannot_pin_more_caches_than_a_cap(swarm, stranger, expected):
    plan_id, stages = plan_of(swarm)
    first = by_id(swarm, stages[0]["node_id"])
    before = {n.node_id: get_json(n.url + "/health")[1]["cached_requests"] for n in swarm.nodes}
    fakes = [Forward.of_tokens(f"fake-{i}", plan_id, 0, stranger.node_id, None, [7]) for i in range(300)]
    await stranger.send_all(first.node_id, fakes)
    last = [Forward.of_tokens("fake-last", plan_id, 0, stranger.node_id, GREEDY, [7])]
    await stranger.send_all(first.node_id, last)
    # Its answer means every fake before it was served or refused. A link the node cut after the sweep (the
    # stranger's liveness failed on a loaded machine: send_all) lost it: ask again on a new link.
    for attempt in range(3):
        try:
            await wait_answer(stranger, "fake-last", timeout=30)
            break
        except AssertionError:
            if attempt == 2:
                raise
            await stranger.send_all(first.node_id, last)
    cached = {n.node_id: get_json(n.url + "/health")[1]["cached_requests"] for n in swarm.nodes}
    print(f"cached requests after 300 fake ones: {cached}")
    assert all(count <= 64 for count in cached.values()), cached
    # waited for off the loop: the stranger answers the nodes' liveness probes on it (blocked, it was dropped)
    victim = await asyncio.to_thread(Victim(swarm.entry.url, VICTIM, VICTIM_TOKENS, swarm.entry.log).start().wait)
    assert victim.error is None and victim.text == expected
    # The stranger is these requests' entry: its releases free them (on each stage it reaches).
    releases = [Release(f"fake-{i}") for i in range(300)] + [Release("fake-last")]
    for stage in stages:
        await stranger.send_all(stage["node_id"], releases)
    await eventually(lambda: all(get_json(n.url + "/health")[1]["cached_requests"] <= before[n.node_id]
                                 for n in swarm.nodes), timeout=30, what="the fakes released by their entry",
                     blocking=True)


async def test_fake_requests_cannot_hold_more_kv_than_a_cap(swarm, stranger):
    plan_id, stages = plan_of(swarm)
    first = by_id(swarm, stages[0]["node_id"])
    refused = 0
    for i in range(6):  # 6 requests of 4,000 positions: nearly 6 whole contexts (4,096) for one peer
        rid = f"kv-{i}"
        frames = [Forward.of_tokens(rid, plan_id, 0, stranger.node_id, None, [7] * 2048),
                  Forward.of_tokens(rid, plan_id, 2048, stranger.node_id, GREEDY, [7] * 1952)]
        for attempt in range(2):
            # The stranger's link may have sat idle past the node's idle timeout during earlier tests on a
            # loaded machine: frames sent as the node retires it are lost (the link is redialled after).
            await stranger.send_all(first.node_id, frames)
            try:
                _, answer = await wait_answer(stranger, rid, timeout=45.0)
                break
            except AssertionError:
                if attempt:
                    raise
        refused += isinstance(answer, Error) and answer.kind == "cache" and "KV cache" in answer.message
    health = {n.node_id: get_json(n.url + "/health")[1] for n in swarm.nodes}
    print("(cached requests, KV bytes):", {k: (h["cached_requests"], h["cached_kv_bytes"]) for k, h in health.items()})
    assert refused == 4, "one peer may hold two whole contexts' worth of caches on a stage, no more"
    for stage in stages:
        await stranger.send_all(stage["node_id"], [Release(f"kv-{i}") for i in range(6)])


# -- the frames that crashed nodes: last, since on the old code they take the node down -------
@pytest.mark.parametrize("token", [100_000_000, 384, 999_999, -1])
async def test_token_ids_outside_the_vocabulary_are_refused(swarm, stranger, expected, token):
    plan_id, stages = plan_of(swarm)
    first = stages[0]["node_id"]
    rid = f"oob-{token}"
    await stranger.send_all(first, [Forward.of_tokens(rid, plan_id, 0, stranger.node_id, GREEDY, [1, token])])
    sender, answer = await wait_answer(stranger, rid)
    assert isinstance(answer, Error) and answer.kind == "protocol" and "vocabulary" in answer.message, answer
    status, reply = http_json(swarm.entry.url + "/v1/chat/completions",
                              {"messages": VICTIM, "max_tokens": VICTIM_TOKENS, "temperature": 0})
    assert status == 200 and reply["choices"][0]["message"]["content"] == expected


async def test_a_thousand_hostile_frames_change_nothing(swarm, stranger, expected):
    """Out-of-range ids, huge positions and lengths, wrong senders, wrong shapes: the node serves
    the same text, and its memory and file descriptors stay bounded."""
    plan_id, stages = plan_of(swarm)
    first, second = stages[0], stages[1]
    procs = {n.node_id: psutil.Process(n.proc.pid) for n in swarm.nodes}

    def usage() -> dict:
        return {k: (p.memory_info().rss, p.num_fds()) for k, p in procs.items()}

    before = usage()
    rng = np.random.default_rng(19)
    frames: list[tuple[str, object]] = []
    for i in range(1000):
        rid, kind = f"h-{i % 50}", i % 10
        if kind == 0:
            frames.append((first["node_id"], Forward.of_tokens(rid, plan_id, 0, stranger.node_id, GREEDY,
                                                              [int(rng.integers(384, 2**31 - 1))])))
        elif kind == 1:
            frames.append((first["node_id"], Forward.of_tokens(rid, plan_id, int(rng.integers(4096, 2**31 - 9)),
                                                              stranger.node_id, GREEDY, [1])))
        elif kind == 2:
            frames.append((first["node_id"], Forward.of_tokens(rid, plan_id, 0, stranger.node_id, None,
                                                              [1] * int(rng.integers(4097, 9000)))))
        elif kind == 3:  # wrong sender into stage 1
            h = np.zeros((1, 1, 64), np.float32)
            frames.append((second["node_id"], Forward(rid, plan_id, 0, second["start"], stranger.node_id, GREEDY,
                                                      "float32", h.shape, h.tobytes())))
        elif kind == 4:  # wrong shape into stage 0's successor position
            h = np.zeros((1, 1, int(rng.integers(1, 200))), np.float32)
            frames.append((second["node_id"], Forward(rid, plan_id, 0, second["start"], first["node_id"], GREEDY,
                                                      "float32", h.shape, h.tobytes())))
        elif kind == 5:
            frames.append((first["node_id"], Token(rid, plan_id, int(rng.integers(1, 5000)),
                                                   int(rng.integers(0, 384)))))
        elif kind == 6:
            frames.append((first["node_id"], Error(rid, plan_id, "cache", "hostile")))
        elif kind == 7:
            frames.append((second["node_id"], Release(rid)))
        elif kind == 8:  # into a layer no stage starts at, and another plan
            frames.append((second["node_id"], Forward.of_tokens(rid, "no-such-plan", 0, stranger.node_id, GREEDY,
                                                                [1])))
        else:
            frames.append((first["node_id"], Forward.of_tokens(rid, plan_id, 0, "someone-else", GREEDY, [1])))
    victim = Victim(swarm.entry.url, VICTIM, VICTIM_TOKENS, swarm.entry.log).start()
    for start in range(0, len(frames), 50):
        for node_id in {n for n, _ in frames[start:start + 50]}:
            await stranger.send_all(node_id, [m for n, m in frames[start:start + 50] if n == node_id])
        await asyncio.sleep(0.01)
    await asyncio.to_thread(victim.wait)
    assert victim.error is None and victim.text == expected
    await asyncio.sleep(1.0)
    after = usage()
    for node_id in procs:
        (rss0, fds0), (rss1, fds1) = before[node_id], after[node_id]
        print(f"{node_id}: RSS {rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MiB, fds {fds0} -> {fds1}")
        assert rss1 - rss0 < 200 * 2**20 and fds1 - fds0 < 10
    for node in swarm.nodes:
        assert node.proc.poll() is None, f"{node.node_id} died"
    status, reply = http_json(swarm.entry.url + "/v1/chat/completions",
                              {"messages": VICTIM, "max_tokens": VICTIM_TOKENS, "temperature": 0})
    assert status == 200 and reply["choices"][0]["message"]["content"] == expected

