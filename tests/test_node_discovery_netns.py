"""Discovery as the node daemon does it: real swarm-node processes on separate hosts."""

from __future__ import annotations

import time

import pytest
from helpers import wait_until
from netns import netns_unavailable_reason
from swarm_cluster import PEER_PORT, SwarmCluster

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))


def known_ids(node) -> set[str]:
    top = node.topology()
    return {n["id"] for n in top["nodes"]} if top else set()


def test_nodes_find_each_other_and_notice_a_crash(tmp_path, llama):
    cluster = SwarmCluster(tmp_path, 3, ["--model", str(llama)])
    try:
        cluster.wait_serving(stages=3, timeout=60)
        ids = [n.node_id for n in cluster.nodes]
        victim = cluster.nodes[2]
        victim.proc.kill9()
        killed = time.monotonic()
        # Three failed probes 0.75 s apart: under 3 s by design; the rest is a loaded machine's margin.
        noticed = wait_until(lambda: all(ids[2] not in known_ids(n) for n in cluster.nodes[:2]), 8, "crash noticed")
        print(f"crash noticed in {noticed - killed:.2f}s")
        victim.start()
        wait_until(lambda: all(known_ids(n) == set(ids) for n in cluster.nodes), 30, "rejoined")
        cluster.wait_serving(stages=3, timeout=60)
    finally:
        cluster.close()


def test_two_swarms_on_one_lan_stay_apart(tmp_path, llama):
    per_node = [["--swarm", "red"], ["--swarm", "blue"], ["--swarm", "red"], ["--swarm", "blue"]]
    cluster = SwarmCluster(tmp_path, 4, ["--model", str(llama)], per_node)
    try:
        red, blue = cluster.nodes[0::2], cluster.nodes[1::2]
        for group in (red, blue):
            top = cluster.wait_serving(stages=2, nodes=group, timeout=60)
            assert {n["id"] for n in top["nodes"]} == {n.node_id for n in group}
        time.sleep(2)  # time enough for any stray announcement to arrive
        assert known_ids(red[0]).isdisjoint(known_ids(blue[0]))
    finally:
        cluster.close()


def test_static_peers_form_a_swarm_without_mdns(tmp_path, llama):
    # Peers' addresses are known only once the hosts exist: the nodes start after.
    cluster = SwarmCluster(tmp_path, 3, ["--model", str(llama), "--no-mdns"], start=False)
    try:
        for node in cluster.nodes:
            node.extra = [arg for other in cluster.nodes if other is not node
                          for arg in ("--peer", f"{other.host.ip}:{PEER_PORT}")]
            node.start()
        top = cluster.wait_serving(stages=3, timeout=60)
        assert len(top["nodes"]) == 3
        status, reply = cluster.nodes[2].post("/v1/chat/completions",
                                              {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
        assert status == 200 and reply["usage"]["completion_tokens"] >= 1
    finally:
        cluster.close()
