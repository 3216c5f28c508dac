"""Two hosts joined by two LANs, one of them slow: activations take the fast one, and a cut of it during a
chat falls back to the other, with the same text.

Every host has an address on LAN 0 (advertised first) and one on LAN 1. Each node holds every frame it sends
to the other's LAN 0 address for 20 ms (SWARM_HOLD_FRAMES by address: the data lane's frames and the path
probes' alike), so LAN 0 is the slow path. Both nodes state equal speeds (two equal stages).

- the data link between them ends up on LAN 1 (/health's peer_paths: the address each link is on), and
  the measured round trip of LAN 0 shows its hold;
- a chat gives mlx-lm's greedy text;
- LAN 1 is cut (the bridge side of node 1's cable) while a chat streams: it completes with the same text,
  and the link moves to LAN 0 within the liveness window plus a loaded machine's margin; the next chat
  goes over LAN 0 with the same text;
- all of it in an open swarm and in a closed one (a secret: its mDNS records are hints).
"""

from __future__ import annotations


import pytest
from helpers import chat_body, reply_text
from netns import netns_unavailable_reason
from netns_client import Stream
from reference import reference_chat
from swarm_cluster import SwarmCluster

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

HOLD_MS = 20
SLOW, FAST = 0, 1  # the LANs
QUESTION = "What is the capital of France?"
TOKENS = 8
# A step of the tiny llama costs milliseconds: a long answer, so that the cut lands mid-stream.
STORY = [{"role": "user", "content": "Tell me a story about the sea"}]
STORY_TOKENS = 200
# How long a link may take to move: measuring both paths, or noticing a cut path (about the liveness
# window, 3 s), on a machine whose two cores other tests share.
MOVE_TIMEOUT_S = 60


@pytest.fixture(scope="module", params=["open", "closed"])
def swarm(request, tmp_path_factory, llama):
    # A closed swarm's mDNS records are only hints, proved by the secret at one address: the others are
    # dialed too, and each link's hello proves the secret again.
    secret = "paths-secret" if request.param == "closed" else None
    cluster = SwarmCluster(tmp_path_factory.mktemp("paths"), 2, ["--model", str(llama)], start=False, lans=2,
                           secret=secret)
    try:
        a, b = cluster.nodes
        a.start(env={"SWARM_HOLD_FRAMES": f"{b.host.ips[SLOW]}:{HOLD_MS}"})
        b.start(env={"SWARM_HOLD_FRAMES": f"{a.host.ips[SLOW]}:{HOLD_MS}"})
        cluster.wait_serving(stages=2, timeout=180)
        yield cluster, [n.node_id for n in cluster.nodes]
    finally:
        cluster.close()


def paths(node) -> dict:
    status, health = node.get("/health")
    return health.get("peer_paths", {}) if status == 200 else {}


def links_on(cluster, ids, lan: int) -> dict | None:
    """Each node's path entry for the other, when both links are on the other's address on `lan`."""
    seen = {}
    for i, node in enumerate(cluster.nodes):
        other = cluster.nodes[1 - i]
        entry = paths(node).get(ids[1 - i])
        if not entry or entry.get("link") != other.host.ips[lan]:
            return None
        seen[i] = entry
    return seen


def test_activations_take_the_fast_path_and_fall_back_when_it_is_cut(swarm, llama):
    cluster, ids = swarm
    a, b = cluster.nodes

    def on_fast_path_measured():
        seen = links_on(cluster, ids, FAST)
        if seen and all(len(e.get("rtt_ms", {})) == 2 for e in seen.values()):
            return seen
        return None

    seen = cluster.wait_for("both links on the fast LAN, both paths measured", on_fast_path_measured,
                            MOVE_TIMEOUT_S, 0.5, lambda: f"{[paths(n) for n in cluster.nodes]}\n")
    print(f"\npaths: {seen}")
    for i, entry in seen.items():
        other = cluster.nodes[1 - i].host
        assert entry["rtt_ms"][other.ips[SLOW]] >= HOLD_MS  # the hold really holds the probes' frames

    expected, _ = reference_chat(llama, chat_body(QUESTION)["messages"], TOKENS)
    status, reply = a.post("/v1/chat/completions", chat_body(QUESTION, TOKENS), timeout=180)
    assert status == 200, reply
    assert reply_text(reply) == expected
    assert links_on(cluster, ids, FAST), [paths(n) for n in cluster.nodes]

    story, _ = reference_chat(llama, STORY, STORY_TOKENS)
    stream = Stream(a, chat_body(STORY, STORY_TOKENS))
    stream.wait_tokens(4)
    b.host.link_down(FAST)
    assert stream.finish() == story

    cluster.wait_for("both links on the slow LAN after the cut", lambda: links_on(cluster, ids, SLOW),
                     MOVE_TIMEOUT_S, 0.5, lambda: f"{[paths(n) for n in cluster.nodes]}\n")
    status, reply = a.post("/v1/chat/completions", chat_body(QUESTION, TOKENS), timeout=180)
    assert status == 200, reply
    assert reply_text(reply) == expected
    assert links_on(cluster, ids, SLOW), [paths(n) for n in cluster.nodes]
    assert all(len((n.topology() or {}).get("plan", {}).get("stages", [])) == 2 for n in cluster.nodes)
