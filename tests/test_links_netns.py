"""Links measured and advertised between real nodes, and an idle swarm that stays quiet.

Three real nodes on netns hosts, measuring their own speeds (none stated: their speed follows their
passes) and splitting layers by memory (every node holds a stage whichever speeds they measure).
Node 2 holds every data frame it sends for 30 ms (SWARM_HOLD_FRAMES): each node's advertised links
show it (>= 30 ms, less half a step of the advertised grid, to and from node 2; loopback-fast between
the others), a request that enters at node 2 pays it on every token (whether the plan keeps node 2 as a
stage or, its links being slow, leaves it out: every step leaves node 2), and the text is the same. Then, idle, the
swarm's view (plans, advertised links and speeds) does not change for 60 s while the measurements run:
the shorter form of "no re-plan in 10 minutes of an idle, quiet swarm" (test_present_speed.py and
test_link_estimate.py run the same rules over 10 simulated minutes of noise).
"""

from __future__ import annotations

import time

import pytest
from helpers import chat_body, reply_text
from netns import netns_unavailable_reason
from reference import reference_chat
from swarm_cluster import SwarmCluster

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

HOLD_MS = 30
GRID_HALF_STEP = 2 ** (-1 / 6)  # the advertised round trip is the nearest third of an octave
QUIET_WATCH_S = 60.0
QUESTION = "What is the capital of France?"
TOKENS = 8


def view(node) -> dict[str, dict]:
    """Each node's profile as `node` sees it: {node id: topology entry}."""
    top = node.topology() or {}
    return {n["id"]: n for n in top.get("nodes", [])}


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, llama):
    cluster = SwarmCluster(tmp_path_factory.mktemp("links"), 3, ["--model", str(llama), "--strategy", "memory"],
                           start=False, stated_speed=False)
    try:
        cluster.nodes[0].start()
        cluster.nodes[1].start()
        cluster.nodes[2].start(env={"SWARM_HOLD_FRAMES": f"*:{HOLD_MS}"})
        cluster.wait_serving(stages=3, timeout=180)
        ids = [n.node_id for n in cluster.nodes]
        yield cluster, ids
    finally:
        cluster.close()


def test_links_are_measured_and_advertised_and_a_held_node_pays_its_delay(swarm, llama):
    cluster, ids = swarm
    slow = HOLD_MS / 1000 * GRID_HALF_STEP

    def measured():
        seen = view(cluster.nodes[0])
        links = {a: {b: v["rtt_s"] for b, v in (seen.get(a, {}).get("measured_links") or {}).items()} for a in ids}
        if all(len(links[a]) == 2 for a in ids):
            return links
        return None

    links = cluster.wait_for("every node's links to both others advertised", measured, 90)
    print("\nadvertised round trips (ms): " + "; ".join(
        f"{ids.index(a)}->{ids.index(b)} {rtt * 1e3:.2f}" for a in ids for b, rtt in sorted(links[a].items())))
    for a in ids:
        for b, rtt in links[a].items():
            if ids[2] in (a, b):  # node 2's frames (pings it sends, pongs it answers) wait 30 ms
                assert rtt >= slow, (a, b, rtt)
            else:
                assert rtt < 0.015, (a, b, rtt)
    bws = view(cluster.nodes[1])[ids[1]]["measured_links"]
    assert all(v["bytes_per_s"] > 0 for v in bws.values()), bws  # the padded pings measured them

    # The held frames are really held: a request that enters at node 2 pays 30 ms per token at least (one
    # step a token: no drafts).
    expected, n_tokens = reference_chat(llama, chat_body(QUESTION)["messages"], TOKENS)
    stages = [ids.index(s["node_id"]) for s in cluster.nodes[2].topology()["plan"]["stages"]]
    t0 = time.monotonic()
    status, reply = cluster.nodes[2].post("/v1/chat/completions", {**chat_body(QUESTION, TOKENS), "speculate": False},
                                          timeout=180)
    took = time.monotonic() - t0
    assert status == 200, reply
    assert reply_text(reply) == expected
    print(f"{n_tokens} tokens entering at node 2 (stages: nodes {stages}) in {took * 1e3:.0f} ms")
    assert took >= n_tokens * HOLD_MS / 1000


def test_an_idle_swarm_keeps_its_view_while_it_measures(swarm):
    """Plans, advertised links and speeds as each node sees the others: unchanged for 60 s."""
    cluster, ids = swarm
    time.sleep(15)  # the request of the test before: its passes' speed samples go stale first

    def snapshot():
        out = []
        for node in cluster.nodes:
            top = node.topology() or {}
            out.append(((top.get("plan") or {}).get("id"),
                        tuple((n["id"], n["speed"], tuple(sorted((b, v["rtt_s"], v["bytes_per_s"])
                                                                for b, v in n["measured_links"].items())))
                              for n in sorted(top.get("nodes", []), key=lambda n: n["id"]))))
        return out

    first = snapshot()
    assert all(plan for plan, _ in first) and len({plan for plan, _ in first}) == 1, first
    logs_before = [n.proc.stderr_log.read_text(errors="replace").count(" plan ") for n in cluster.nodes]
    deadline = time.monotonic() + QUIET_WATCH_S
    checks = 0
    while time.monotonic() < deadline:
        time.sleep(3.0)
        now = snapshot()
        assert now == first, f"the view changed after {checks * 3} s:\n{first}\n{now}"
        checks += 1
    logs_after = [n.proc.stderr_log.read_text(errors="replace").count(" plan ") for n in cluster.nodes]
    assert logs_after == logs_before
