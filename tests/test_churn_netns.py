"""Churn on real hosts: nodes die, come back, join and get cut off while streams run.

Every stream whose entry node survives must finish with exactly the text of an
undisturbed run; the client sees a pause, never an error or a repeated token.
"""

from __future__ import annotations

import os
import time

import pytest
from helpers import chat_body
from netns import netns_unavailable_reason
from netns_client import Stream
from reference import reference_chat
from swarm_cluster import SwarmCluster

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

MESSAGES = [{"role": "user", "content": "Write a short story about a cat who learns to fly."}]
TOKENS = 36
RECOVERY_TIMES: list[float] = []


def greedy(max_tokens: int = TOKENS) -> dict:
    return chat_body(MESSAGES, max_tokens)


def seeded(max_tokens: int = TOKENS) -> dict:
    return chat_body(MESSAGES, max_tokens, temperature=0.9, top_p=0.95, seed=1234)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, default_model):
    # A swarm with a secret, as a user should run one: plans and deaths then travel only by the
    # authenticated probe, not by mDNS. (SWARM_CHURN_OPEN=1: the same tests on an open swarm.)
    secret = None if os.environ.get("SWARM_CHURN_OPEN") else "churn-test-secret-0a9f7c"
    cluster = SwarmCluster(tmp_path_factory.mktemp("churn"), 3, ["--recovery-timeout", "60"], secret=secret)
    try:
        cluster.wait_serving(stages=3)
        yield cluster
    finally:
        cluster.close()
        if RECOVERY_TIMES:
            print(f"\nrecovery (death -> next token), {len(RECOVERY_TIMES)} deaths: "
                  f"min {min(RECOVERY_TIMES):.2f}s, median {sorted(RECOVERY_TIMES)[len(RECOVERY_TIMES) // 2]:.2f}s, "
                  f"max {max(RECOVERY_TIMES):.2f}s")


@pytest.fixture(scope="module")
def undisturbed(swarm, default_model):
    greedy_text, _ = reference_chat(default_model.path, MESSAGES, TOKENS)
    seeded_stream = Stream(swarm.nodes[0], seeded())
    return {"greedy": greedy_text, "seeded": seeded_stream.finish()}


def test_ten_kill_restart_cycles_during_streams(swarm, undisturbed):
    entry = swarm.nodes[0]
    for cycle in range(10):
        victim = swarm.nodes[1 + cycle % 2]
        kind = "seeded" if cycle % 3 == 2 else "greedy"
        stream = Stream(entry, seeded() if kind == "seeded" else greedy())
        stream.wait_tokens(4)
        victim.proc.kill9()
        killed_at = time.monotonic()
        text = stream.finish()
        assert text == undisturbed[kind], f"cycle {cycle} ({kind})"
        RECOVERY_TIMES.append(stream.gap_after(killed_at))
        victim.start()
        swarm.wait_serving(stages=3)
    print("recovery times:", [f"{t:.2f}" for t in RECOVERY_TIMES])
    assert max(RECOVERY_TIMES) < 30


def test_link_cut_and_restored(swarm, undisturbed):
    victim = swarm.nodes[2]
    stream = Stream(swarm.nodes[0], greedy())
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
