"""Strangers cannot fake a member's death (issue 33): floods of connections never split the swarm.

A swarm of three on hosts of their own and a stranger host with 60 addresses of its own. Only
the peers themselves decide whether they are alive:
- half-finished hellos from 60 addresses at every node, held, filled each node's
  peer-port budget, which members shared with strangers: their probes were refused and each
  node ended alone. Now members have a reserve strangers cannot take.
- HTTP slowloris from 40 addresses at one node limited to 2,048 descriptors (what mlx-lm's
  import leaves a node): 64 connections per address were allowed with no total, accept()
  ran out of descriptors, the node's own probes failed and it declared its peers gone. Now
  the API holds at most half the descriptor limit, and a node out of descriptors declares
  nobody gone.
Either way: no node leaves any view, the plan never changes, and the text is the same after.
"""

from __future__ import annotations

import resource
import threading
import time

import pytest
from discovery.profile import PROTOCOL_VERSION
from netns import netns_unavailable_reason
from netns_client import in_netns
from stranger import half_hello, held_connections
from swarm_cluster import API_PORT, PEER_PORT, SwarmCluster

pytestmark = [pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason())),
              pytest.mark.timeout(600)]

# Each flood fills its target within a second or two and is held for several times the ~3 s in which
# liveness declares a silent peer gone (3 failed probes, 0.75 s apart, 0.5 s each).
FLOOD_S = 15.0
QUESTION = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12,
            "temperature": 0}
SLOW_HEADERS = b"GET /health HTTP/1.1\r\nHost: swarm\r\n"
NO_ANSWER = "(no answer)"  # a sample whose topology request got none within its 5 s


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, tiny_models):
    cluster = SwarmCluster(tmp_path_factory.mktemp("liveness-floods"), 3, ["--model", str(tiny_models["llama"])])
    try:
        stranger = cluster.network.add_host()
        sources = [f"10.77.1.{100 + i}" for i in range(60)]
        for address in sources:
            stranger.exec("ip", "addr", "add", f"{address}/24", "dev", "eth0")
        cluster.wait_serving(stages=3, timeout=180)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's sockets live in this process
        yield cluster, stranger, sources
    finally:
        cluster.close()


def watch_during(cluster, attack, seconds: float) -> tuple[dict, list]:
    """Run `attack()` while sampling every node's plan and view each second; (its result, the samples)."""
    samples: list[tuple[float, int, str | None, int]] = []
    result: dict = {}
    stop = threading.Event()

    def run() -> None:
        result.update(attack())

    def watch() -> None:
        while not stop.is_set():
            for node in cluster.nodes:
                top = node.topology()
                if top is None:  # no answer in 5 s (this test's own request, in the attack's crowd)
                    samples.append((time.monotonic(), node.index, NO_ANSWER, 0))
                    continue
                samples.append((time.monotonic(), node.index, (top.get("plan") or {}).get("id"),
                                len(top.get("nodes", []))))
            time.sleep(1.0)

    attacker, watcher = threading.Thread(target=run, daemon=True), threading.Thread(target=watch, daemon=True)
    watcher.start()
    attacker.start()
    attacker.join(seconds + 120)
    time.sleep(3.0)  # a death noticed just after the attack still shows
    stop.set()
    watcher.join(30)
    assert not attacker.is_alive()
    return result, samples


def assert_one_view_and_plan(cluster, plan_before: str, samples: list) -> None:
    answered = [s for s in samples if s[2] is not NO_ANSWER]
    changed = [(round(t, 1), i, p, n) for t, i, p, n in answered if p != plan_before or n != len(cluster.nodes)]
    assert not changed, f"a view or plan changed under the flood: {changed[:10]}"
    for node in cluster.nodes:
        mine = [s for s in samples if s[1] == node.index]
        assert len([s for s in mine if s[2] is not NO_ANSWER]) * 2 >= len(mine), f"node{node.index} seldom answered"
    for node in cluster.nodes:
        gone = [line for line in node.proc.stderr_log.read_text().splitlines() if ": gone" in line]
        assert not gone, f"node{node.index} declared a peer gone: {gone[:3]}"


def test_half_finished_hellos_from_60_addresses_at_every_node_split_nothing(swarm):
    cluster, stranger, sources = swarm
    status, before = cluster.nodes[0].post("/v1/chat/completions", QUESTION, timeout=120)
    assert status == 200, before
    plan_before = cluster.nodes[0].topology()["plan"]["id"]
    targets = [(node.host.ip, PEER_PORT) for node in cluster.nodes]
    opening = half_hello(swarm="default", version=PROTOCOL_VERSION)
    result, samples = watch_during(
        cluster, lambda: in_netns(stranger.ns, held_connections, targets, sources, 12, FLOOD_S, opening), FLOOD_S)
    print("half hellos:", result, f"{len(samples)} samples")
    assert result["opened"] >= len(sources) * 12, result  # the flood really was one
    assert_one_view_and_plan(cluster, plan_before, samples)
    for node in cluster.nodes:
        status, after = node.post("/v1/chat/completions", QUESTION, timeout=120)
        assert status == 200, after
        assert after["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]


def test_http_slowloris_from_40_addresses_splits_nothing(swarm):
    cluster, stranger, sources = swarm
    target = cluster.nodes[0]
    # As a node runs that was started under `ulimit -n 2048` (and as mlx-lm's import left every node).
    resource.prlimit(target.proc.pid, resource.RLIMIT_NOFILE, (2048, 2048))
    status, before = target.post("/v1/chat/completions", QUESTION, timeout=120)
    assert status == 200, before
    plan_before = target.topology()["plan"]["id"]
    result, samples = watch_during(
        cluster, lambda: in_netns(stranger.ns, held_connections, [(target.host.ip, API_PORT)], sources[:40], 64,
                                  FLOOD_S, SLOW_HEADERS, b"X-a: b\r\n", 5.0, until_opened=40 * 64), FLOOD_S)
    print("slowloris:", result, f"{len(samples)} samples")
    assert_one_view_and_plan(cluster, plan_before, samples)
    assert result["opened"] >= 40 * 64, result
    deadline = time.monotonic() + 60  # the held connections are closed by now; the node serves again
    while True:
        status, after = target.post("/v1/chat/completions", QUESTION, timeout=120)
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert status == 200, after
    assert after["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
