"""Churn on real hosts: nodes die, come back, join and get cut off while streams run.

Every stream whose entry node survives must finish with exactly the text of an
undisturbed run; the client sees a pause, never an error or a repeated token. The ten kill
cycles and the link cut run on the tiny llama (their point is the text through deaths, not the
default model: a restart's reload and a stream's steps then cost a fraction); a join and an
entry's death need a stream that outlasts a node's start, so they run on the default model.
"""

from __future__ import annotations

import os
import time

import pytest
from helpers import chat_body
from netns import netns_unavailable_reason
from netns_client import Stream
from reference import reference_chat
from swarm_cluster import SwarmCluster, serving_swarm

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

MESSAGES = [{"role": "user", "content": "Write a short story about a cat who learns to fly."}]
TOKENS = 36
# A step of the tiny llama costs milliseconds: a longer answer, so that a kill still lands mid-stream (the
# tiny llama's greedy answer to this prompt, and its answer sampled with seed 2, run past 200 tokens).
TINY_MESSAGES = [{"role": "user", "content": "Tell me a story about the sea"}]
TINY_TOKENS = 200
TINY_SEED = 2
RECOVERY_TIMES: list[float] = []
# A recovery slower than this has the surviving nodes' log tails kept: a failure then says why.
SLOW_RECOVERY_S = 20


def greedy(max_tokens: int = TOKENS, messages: list[dict] = MESSAGES) -> dict:
    return chat_body(messages, max_tokens)


def seeded(max_tokens: int = TOKENS, messages: list[dict] = MESSAGES, seed: int = 1234) -> dict:
    return chat_body(messages, max_tokens, temperature=0.9, top_p=0.95, seed=seed)


def secured_swarm(root, model_args: list[str]):
    # A swarm with a secret, as a user should run one: plans and deaths then travel only by the
    # authenticated probe, not by mDNS. (SWARM_CHURN_OPEN=1: the same tests on an open swarm.)
    secret = None if os.environ.get("SWARM_CHURN_OPEN") else "churn-test-secret-0a9f7c"
    return serving_swarm(root, 3, [*model_args, "--recovery-timeout", "60"], stages=3, secret=secret)


@pytest.fixture(scope="module", autouse=True)
def recovery_report():
    yield
    if RECOVERY_TIMES:
        print(f"\nrecovery (death -> next token), {len(RECOVERY_TIMES)} deaths: "
              f"min {min(RECOVERY_TIMES):.2f}s, median {sorted(RECOVERY_TIMES)[len(RECOVERY_TIMES) // 2]:.2f}s, "
              f"max {max(RECOVERY_TIMES):.2f}s")


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, default_model):
    with secured_swarm(tmp_path_factory.mktemp("churn"), []) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tiny_swarm(tmp_path_factory, llama):
    with secured_swarm(tmp_path_factory.mktemp("churn-tiny"), ["--model", str(llama)]) as cluster:
        yield cluster


def undisturbed_texts(swarm, model_dir, tokens: int, messages: list[dict], seed: int) -> dict:
    """The greedy text one machine gives, and the seeded text of an undisturbed stream through `swarm`."""
    greedy_text, greedy_tokens = reference_chat(model_dir, messages, tokens)
    seeded_stream = Stream(swarm.nodes[0], seeded(tokens, messages, seed))
    return {"greedy": greedy_text, "seeded": seeded_stream.finish(), "greedy_tokens": greedy_tokens,
            "seeded_reasons": [c.get("finish_reason") for _, e in seeded_stream.events if isinstance(e, dict)
                               for c in e.get("choices") or [] if c.get("finish_reason")]}


@pytest.fixture(scope="module")
def undisturbed(swarm, default_model):
    return undisturbed_texts(swarm, default_model.path, TOKENS, MESSAGES, 1234)


@pytest.fixture(scope="module")
def tiny_undisturbed(tiny_swarm, llama):
    texts = undisturbed_texts(tiny_swarm, llama, TINY_TOKENS, TINY_MESSAGES, TINY_SEED)
    # Both run their whole length: a stream that ended early could end before the kill it is for.
    assert texts["greedy_tokens"] == TINY_TOKENS and texts["seeded_reasons"] == ["length"], texts
    return texts


def test_ten_kill_restart_cycles_during_streams(tiny_swarm, tiny_undisturbed):
    swarm, undisturbed = tiny_swarm, tiny_undisturbed
    entry = swarm.nodes[0]
    slow: list[str] = []
    drafted = drafts(entry)
    for cycle in range(10):
        victim = swarm.nodes[1 + cycle % 2]
        kind = "seeded" if cycle % 3 == 2 else "greedy"
        body = seeded(TINY_TOKENS, TINY_MESSAGES, TINY_SEED) if kind == "seeded" else greedy(TINY_TOKENS, TINY_MESSAGES)
        stream = Stream(entry, body)
        stream.wait_tokens(4)
        victim.proc.kill9()
        killed_at = time.monotonic()
        text = stream.finish()
        assert text == undisturbed[kind], f"cycle {cycle} ({kind})"
        RECOVERY_TIMES.append(stream.gap_after(killed_at))
        if RECOVERY_TIMES[-1] > SLOW_RECOVERY_S:
            survivors = [n for n in swarm.nodes if n is not victim]
            slow.append(f"cycle {cycle} ({kind}, node{victim.index} killed): the stream waited "
                        f"{RECOVERY_TIMES[-1]:.1f} s\n{swarm.log_tails(survivors)}")
        victim.start()
        swarm.wait_serving(stages=3)
    print("recovery times:", [f"{t:.2f}" for t in RECOVERY_TIMES])
    assert max(RECOVERY_TIMES) < 30, "\n\n".join(slow)
    # The streams' steps carried drafts (speculation is on by default): kills landed with drafts out too.
    # (The tiny llama's answers accept few of prompt lookup's; a replay of accepted drafts after a broken
    # pipeline is test_speculation.py's.)
    assert drafts(entry)["drafts_proposed"] > drafted["drafts_proposed"] + 20, (drafted, drafts(entry))


def drafts(node) -> dict:
    """The entry's speculation counters (/health)."""
    status, health = node.get("/health")
    assert status == 200, health
    return health["speculation"]


def test_link_cut_and_restored(tiny_swarm, tiny_undisturbed):
    swarm, undisturbed = tiny_swarm, tiny_undisturbed
    victim = swarm.nodes[2]
    stream = Stream(swarm.nodes[0], greedy(TINY_TOKENS, TINY_MESSAGES))
    stream.wait_tokens(4)
    victim.host.link_down()
    cut_at = time.monotonic()
    try:
        assert stream.finish() == undisturbed["greedy"]
        RECOVERY_TIMES.append(stream.gap_after(cut_at))
        swarm.wait_serving(stages=2, nodes=swarm.nodes[:2])
    finally:
        victim.host.link_up()
    swarm.wait_serving(stages=3)


def test_join_during_a_request(swarm, undisturbed):
    late = swarm.nodes[1]
    late.proc.kill9()
    swarm.wait_serving(stages=2, nodes=[swarm.nodes[0], swarm.nodes[2]])
    stream = Stream(swarm.nodes[0], greedy())
    stream.wait_tokens(4)
    late.start()
    assert stream.finish() == undisturbed["greedy"]
    swarm.wait_serving(stages=3)


def test_entry_death_breaks_only_its_own_clients(swarm, undisturbed):
    doomed_entry = swarm.nodes[1]
    mine = Stream(doomed_entry, greedy(200))
    other = Stream(swarm.nodes[0], greedy())
    mine.wait_tokens(3)
    other.wait_tokens(3)
    doomed_entry.proc.kill9()
    assert other.finish() == undisturbed["greedy"]
    mine.thread.join(30)
    # Its client sees the break: the stream ends without [DONE] (or with a connection error).
    assert not mine.thread.is_alive() and not mine.done
    doomed_entry.start()
    swarm.wait_serving(stages=3)


def test_lost_capacity_gives_503_then_recovers(tmp_path, llama):
    # Each node can hold 4 of the 6 layers: the model needs both.
    cluster = SwarmCluster(tmp_path, 2, ["--model", str(llama), "--recovery-timeout", "3",
                                         "--memory-limit", "5.2M"])
    try:
        cluster.wait_serving(stages=2)
        survivor, victim = cluster.nodes
        victim.proc.kill9()
        deadline = time.monotonic() + 15
        while True:
            status, health = survivor.get("/health")
            if status == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == 503 and "cannot hold the model" in health["status"], health
        started = time.monotonic()
        status, reply = survivor.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 5})
        waited = time.monotonic() - started
        assert status == 503 and "cannot hold the model" in reply["error"]["message"], reply
        assert 2.5 < waited < 15, waited
        victim.start()
        cluster.wait_serving(stages=2)
        status, reply = survivor.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 5})
        assert status == 200, reply
    finally:
        cluster.close()
