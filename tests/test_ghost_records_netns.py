"""200 mDNS records that never prove the secret cost a closed swarm bounded work (issue 33).

A swarm with a secret asks every endpoint an mDNS record names for its profile, since only a
proved exchange admits a peer. A host that publishes 200 records of the swarm, each naming a
port of its own that takes connections and never answers (tests/ghost_records.py), had each
node open a handshake to every one of them every round, with no back-off: hundreds a second,
at endpoints a record may place at any third party's address. Now an endpoint that keeps
failing is asked less and less often, and only so many per round: the ghosts' endpoints see a
bounded rate, while the swarm keeps its plan and serves.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from netns import netns_unavailable_reason
from swarm_cluster import SwarmCluster

pytestmark = [pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason())),
              pytest.mark.timeout(600)]

GHOSTS = str(Path(__file__).resolve().parent / "ghost_records.py")
SECRET = "a closed swarm beside ghosts, long enough: 8d2f"
NODES = 2
COUNT = 200
SETTLE_S = 15.0  # the first free tries and the back-off's first doublings
MEASURE_S = 20.0
# Per node at most 16 endpoints a round of 0.75 s (about 21 a second), and each ghost at most every
# 8 s (25 a second for 200): a bound well below what a round of all of them every time would cost.
MAX_RATE = NODES * 16 / 0.75 * 1.4
QUESTION = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8, "temperature": 0}


def test_200_ghost_records_get_a_bounded_rate_of_handshakes_and_the_swarm_serves(tmp_path, tiny_models):
    cluster = SwarmCluster(tmp_path, NODES, ["--model", str(tiny_models["llama"])], secret=SECRET)
    try:
        ghost_host = cluster.network.add_host()
        top = cluster.wait_serving(stages=NODES, timeout=180)
        plan_before = top["plan"]["id"]
        status, before = cluster.nodes[0].post("/v1/chat/completions", QUESTION, timeout=120)
        assert status == 200, before
        ghosts = ghost_host.spawn([sys.executable, GHOSTS, "--interface", ghost_host.ip, "--count", str(COUNT),
                                   "--seconds", str(SETTLE_S + MEASURE_S + 30)], label="ghosts")
        ghosts.wait_event("ready", timeout=120)
        time.sleep(SETTLE_S)
        first = ghosts.wait_event("count", timeout=10, after=ghosts.mark())
        time.sleep(MEASURE_S)
        last = ghosts.wait_event("count", timeout=10, after=ghosts.mark())
        rate = (last["connections"] - first["connections"]) / (last["t"] - first["t"])
        print(f"\n{COUNT} ghost records: {last['connections']} connections in all, {rate:.1f}/s over "
              f"{last['t'] - first['t']:.0f} s after {SETTLE_S:.0f} s (bound {MAX_RATE:.0f}/s)")
        assert first["connections"] > 0, "the nodes never asked the ghosts: the test shows nothing"
        assert rate <= MAX_RATE, f"{rate:.0f} handshakes a second at the ghosts' endpoints"
        for node in cluster.nodes:
            top = node.topology()
            assert top["plan"]["id"] == plan_before and len(top["nodes"]) == NODES, top
            status, after = node.post("/v1/chat/completions", QUESTION, timeout=120)
            assert status == 200, after
            assert after["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
    finally:
        cluster.close()
