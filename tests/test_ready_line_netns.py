"""The `ready:` line names addresses a client can reach: with the API on every address (--api-host 0.0.0.0,
the default), the host's own address first and loopback after, not 127.0.0.1 alone."""

from __future__ import annotations

import re
import time

import pytest
from helpers import http_json
from netns import netns_unavailable_reason
from netns_client import in_netns
from swarm_cluster import API_PORT, SwarmCluster

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))


def test_the_ready_line_names_the_hosts_own_address(tmp_path, tiny_models):
    cluster = SwarmCluster(tmp_path, 1, ["--model", str(tiny_models["llama"]), "--api-host", "0.0.0.0"])
    try:
        node = cluster.nodes[0]
        cluster.wait_serving(stages=1)
        deadline, found = time.monotonic() + 60, None
        while found is None and time.monotonic() < deadline:
            found = re.search(r"ready: (\S+)(?: \(also (.+)\))?\n", node.proc.logs(200) + "\n")
            time.sleep(0.2)
        assert found, node.proc.logs(200)
        assert found.group(1) == f"http://{node.host.ip}:{API_PORT}/v1", found.group(0)
        assert f"http://127.0.0.1:{API_PORT}/v1" in (found.group(2) or "").split(", "), found.group(0)
        status, models = in_netns(node.host.ns, http_json, found.group(1) + "/models")
        assert status == 200 and models["data"][0]["id"] == "llama"
    finally:
        cluster.close()
