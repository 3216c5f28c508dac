"""Discovery as the node daemon does it: real swarm-node processes on separate hosts."""

from __future__ import annotations

import time

import pytest
from model_fixtures import tiny_models  # noqa: F401
from netns import netns_unavailable_reason
from swarm_cluster import PEER_PORT, SwarmCluster

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))


def known_ids(node) -> set[str]:
    top = node.topology()
    return {n["id"] for n in top["nodes"]} if top else set()


def wait_until(pred, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not pred():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout}s"
        time.sleep(0.1)
    return time.monotonic() - start


def test_nodes_find_each_other_and_notice_a_crash(tmp_path, tiny_models):
    cluster = SwarmCluster(tmp_path, 3, ["--model", str(tiny_models["llama"])])
    try:
        cluster.wait_serving(stages=3, timeout=60)
        ids = [n.node_id for n in cluster.nodes]
        victim = cluster.nodes[2]
        victim.proc.kill9()
        took = wait_until(lambda: all(ids[2] not in known_ids(n) for n in cluster.nodes[:2]), 5, "crash noticed")
        print(f"crash noticed in {took:.2f}s")
        victim.start()
        wait_until(lambda: all(known_ids(n) == set(ids) for n in cluster.nodes), 30, "rejoined")
        cluster.wait_serving(stages=3, timeout=60)
    finally:
        cluster.close()


def test_two_swarms_on_one_lan_stay_apart(tmp_path, tiny_models):
    per_node = [["--swarm", "red"], ["--swarm", "blue"], ["--swarm", "red"], ["--swarm", "blue"]]
    cluster = SwarmCluster(tmp_path, 4, ["--model", str(tiny_models["llama"])], per_node)
    try:
        red, blue = cluster.nodes[0::2], cluster.nodes[1::2]
        for group in (red, blue):
            top = cluster.wait_serving(stages=2, nodes=group, timeout=60)
            assert {n["id"] for n in top["nodes"]} == {n.node_id for n in group}
        time.sleep(2)  # time enough for any stray announcement to arrive
        assert known_ids(red[0]).isdisjoint(known_ids(blue[0]))
    finally:
        cluster.close()


def test_static_peers_form_a_swarm_without_mdns(tmp_path, tiny_models):
    cluster = SwarmCluster.__new__(SwarmCluster)  # peers' addresses are known only once hosts exist
    from netns import Network
    from swarm_cluster import SwarmNode
    cluster.root, cluster.network = tmp_path, Network(tmp_path / "net")
    cluster.common = ["--model", str(tiny_models["llama"]), "--no-mdns"]
    try:
        hosts = cluster.network.add_hosts(3)
        cluster.nodes = []
        for i, host in enumerate(hosts):
            peers = [arg for other in hosts if other is not host for arg in ("--peer", f"{other.ip}:{PEER_PORT}")]
            cluster.nodes.append(SwarmNode(cluster, host, i, peers))
        for node in cluster.nodes:
            node.start()
        top = cluster.wait_serving(stages=3, timeout=60)
        assert len(top["nodes"]) == 3
        status, reply = cluster.nodes[2].post("/v1/chat/completions",
                                              {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
        assert status == 200 and reply["usage"]["completion_tokens"] >= 1
    finally:
        cluster.close()
