"""Huge prompts never stall a node's event loop (issue 33).

Four client threads on a host of their own post 420,000-character messages to one node of a
three-node swarm of the default model for 15 s (each too long for the context: a 400 after the
tokenizer has seen it). Tokenizing one took the event loop 0.5-1.3 s, so /health and the
peers' liveness probes waited behind it and the other nodes declared the node gone. Now:
/health (asked from the client host every 0.1 s) answers within 0.2 s (95% of the samples at
least, none past 1.5 s, on a shared machine), the plan never changes on any node, and the
swarm's text afterwards is the text from before.
"""

from __future__ import annotations

import statistics
import threading
import time

import pytest
from helpers import http_json
from netns import netns_unavailable_reason
from netns_client import in_netns
from swarm_cluster import API_PORT

pytestmark = [pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason())),
              pytest.mark.timeout(600)]

FLOOD_S = 15.0  # dozens of huge prompts, ~150 /health samples, several liveness death windows
THREADS = 4
HEALTH_EVERY_S = 0.1
HEALTH_WITHIN_S = 0.2
QUESTION = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12,
            "temperature": 0}
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex bold jackdaws ".split()


def huge_message(chars: int = 420_000, offset: int = 0) -> dict:
    text, i, length = [], offset, 0
    while length < chars:
        text.append(WORDS[i % len(WORDS)] + ("." if i % 11 == 0 else ""))
        length += len(text[-1]) + 1
        i += 7
    return {"messages": [{"role": "user", "content": " ".join(text)[:chars]}], "max_tokens": 4}


@pytest.fixture(scope="module")
def swarm(default_swarm):
    return default_swarm, default_swarm.network.add_host()


def test_four_threads_of_huge_prompts_leave_health_quick_and_the_plan_alone(swarm):
    cluster, client = swarm
    target = cluster.nodes[0]
    url = f"http://{target.host.ip}:{API_PORT}"
    status, before = target.post("/v1/chat/completions", QUESTION, timeout=120)
    assert status == 200, before
    plan_before = target.topology()["plan"]["id"]

    stop = threading.Event()
    answers: list[int] = []
    health: list[tuple[float, float, int]] = []  # (when, seconds, status)
    plans: list[tuple[int, str | None, int]] = []  # (node index, plan id, nodes in its view)
    bodies = [huge_message(offset=i) for i in range(THREADS)]

    def flood(body: dict) -> None:
        while not stop.is_set():
            try:
                code, reply = http_json(url + "/v1/chat/completions", body, 120)
            except OSError:
                code, reply = 0, {}
            answers.append(code)
            if code == 400:
                assert reply["error"]["code"] == "context_length_exceeded", reply

    def poll_health() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                code, _ = http_json(url + "/health", None, 10)
            except OSError:
                code = 0
            health.append((t0, time.monotonic() - t0, code))
            time.sleep(max(0.0, HEALTH_EVERY_S - (time.monotonic() - t0)))

    def watch_plans() -> None:
        while not stop.is_set():
            for node in cluster.nodes:
                top = node.topology() or {}
                plans.append((node.index, (top.get("plan") or {}).get("id"), len(top.get("nodes", []))))
            time.sleep(1.0)

    threads = [threading.Thread(target=in_netns, args=(client.ns, flood, b), daemon=True) for b in bodies]
    threads.append(threading.Thread(target=in_netns, args=(client.ns, poll_health), daemon=True))
    threads.append(threading.Thread(target=watch_plans, daemon=True))
    started = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(FLOOD_S)
    stop.set()
    for t in threads:
        t.join(150)
    assert not any(t.is_alive() for t in threads)

    seconds = sorted(s for _, s, _ in health)
    print(f"{len(answers)} huge prompts in {time.monotonic() - started:.0f} s: {sorted(set(answers))}; "
          f"/health {len(seconds)} times: median {statistics.median(seconds) * 1e3:.0f} ms, "
          f"p95 {seconds[int(len(seconds) * 0.95)] * 1e3:.0f} ms, max {seconds[-1] * 1e3:.0f} ms")
    assert answers and set(answers) == {400}, sorted(set(answers))
    assert len(answers) >= THREADS
    assert all(code == 200 for _, _, code in health), [h for h in health if h[2] != 200][:5]
    # The machine running the tests is shared: a sample may wait for a core now and then. Blocking the loop
    # shows otherwise: a median of ~1.9 s, every sample past 0.2 s, and 503s as peers declared the node gone.
    slow = [(round(t - started, 1), round(s, 3)) for t, s, _ in health if s > HEALTH_WITHIN_S]
    assert len(slow) <= len(health) * 0.05, f"/health slower than {HEALTH_WITHIN_S} s at (s into the flood, s): {slow}"
    assert seconds[-1] < 1.5, slow
    changed = [p for p in plans if p[1] != plan_before or p[2] != len(cluster.nodes)]
    assert not changed, f"a plan or view changed during the flood: {changed[:10]}"
    for node in cluster.nodes:
        top = node.topology()
        assert top["plan"]["id"] == plan_before and len(top["nodes"]) == len(cluster.nodes), top["plan"]
    status, after = target.post("/v1/chat/completions", QUESTION, timeout=120)
    assert status == 200, after
    assert after["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
