"""One established peer connection between each pair of nodes, whoever sent first: real hosts, counted."""

from __future__ import annotations

import concurrent.futures
import time
from collections import Counter

import pytest
from netns import netns_unavailable_reason
from swarm_cluster import PEER_PORT, SwarmCluster

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))


def frame_connections(host) -> Counter:
    """Peer address -> established connections on the peer port, as this host's kernel lists them."""
    out = host.exec("ss", "-Htn", "state", "established", f"( sport = :{PEER_PORT} or dport = :{PEER_PORT} )").stdout
    return Counter(line.split()[-1].rpartition(":")[0] for line in out.splitlines() if line.strip())


def test_each_pair_of_nodes_holds_one_connection(tmp_path, llama):
    cluster = SwarmCluster(tmp_path, 3, ["--model", str(llama)])
    try:
        cluster.wait_serving(stages=3, timeout=90)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
        # Every node is an entry, alone and all at once: frames go every way between every pair.
        for node in cluster.nodes:
            status, reply = node.post("/v1/chat/completions", body)
            assert status == 200 and len(reply["swarm"]["path"]) == 3, reply
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            assert all(s == 200 for s, _ in pool.map(lambda i: cluster.nodes[i % 3].post(
                "/v1/chat/completions", body), range(6)))
        ips = [n.host.ip for n in cluster.nodes]
        # Discovery's profile fetches and liveness probes are short connections of their own on the
        # same port (every 0.75 s): the frame connections are what every sample shows.
        least: dict[tuple[str, str], int] = {}
        for _ in range(8):
            for node in cluster.nodes:
                seen = frame_connections(node.host)
                for other in ips:
                    if other != node.host.ip:
                        key = (node.host.ip, other)
                        least[key] = min(least.get(key, 99), seen.get(other, 0))
            time.sleep(0.25)
        print("established peer connections (host, peer) -> count:", least)
        assert least == {(a, b): 1 for a in ips for b in ips if a != b}, least
        # The nodes' own count agrees: one connection per peer, opened by one side, answered by the other.
        ids = [n.node_id for n in cluster.nodes]
        held = {i: n.get("/health")[1]["peer_connections"] for i, n in zip(ids, cluster.nodes)}
        for a in ids:
            assert sorted(held[a]) == sorted(b for b in ids if b != a), held
            for b, how in held[a].items():
                assert {how, held[b][a]} == {"dialed", "answered"}, held
    finally:
        cluster.close()
