"""Membership that cannot be wedged, on separate hosts (network namespaces, real nodes, mDNS):
a member that never serves its plan, a stranger's record that reuses an honest node's id, a
cloned node with the same id, and a node given another's id by --node-id. Each time the swarm
serves again (how soon is printed), with the text of one machine.

The fakes are tests/fake_member.py: an mDNS record and a profile responder with the swarm's
model fingerprint, a fast speed and a lot of memory, as issue 19's stranger ran them, holding
the model's files so that they prove their layers (only proven peers are planned).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from helpers import chat_body, wait_until
from netns import netns_unavailable_reason
from reference import reference_chat
from swarm_cluster import SwarmCluster

pytestmark = [pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason())),
              pytest.mark.timeout(600)]

FAKE = str(Path(__file__).resolve().parent / "fake_member.py")
MESSAGES = [{"role": "user", "content": "Say hello"}]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def expected(llama):
    return reference_chat(llama, MESSAGES, MAX_TOKENS)[0]


def three_nodes(root: Path, model: Path) -> SwarmCluster:
    cluster = SwarmCluster(root, 3, ["--model", str(model)])
    try:
        cluster.wait_serving(stages=3)
    except BaseException:
        cluster.close()
        raise
    return cluster


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, llama):
    cluster = three_nodes(tmp_path_factory.mktemp("membership"), llama)
    yield cluster
    cluster.close()


def try_chat(node) -> tuple[int, dict]:
    """(status, reply) of a chat through `node`, or (0, the error) when it could not be asked."""
    try:
        return node.post("/v1/chat/completions", chat_body(MESSAGES, MAX_TOKENS), timeout=120)
    except OSError as e:
        return 0, {"error": str(e)}


def served_again(node, expected: str, timeout: float = 180) -> float:
    """When a chat through `node` came back with one machine's text (waiting as long as it takes)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        status, reply = try_chat(node)
        if status == 200:
            assert reply["choices"][0]["message"]["content"] == expected
            return time.monotonic()
        last = (status, reply)
        time.sleep(0.2)
    raise AssertionError(f"node{node.index} did not serve again within {timeout:.0f} s: {last}")


def in_plan(node, node_id: str) -> bool:
    topology = node.topology()
    return bool(topology and topology["plan"] and node_id in {s["node_id"] for s in topology["plan"]["stages"]})


def announces_only_what_it_serves(swarm) -> None:
    """Every node that announces the current plan is one of its stages (an announcement is a promise
    to serve: a node that once held no layers while announcing the plan wedged every chat)."""
    for node in swarm.nodes:
        topology = node.topology()
        plan = topology["plan"]
        stages = {s["node_id"] for s in plan["stages"]}
        announcing = {n["id"] for n in topology["nodes"] if n["plan_id"] == plan["id"]}
        assert announcing <= stages, (announcing, stages)


def spawn_fake(cluster: SwarmCluster, model: Path, *extra: str):
    host = cluster.network.add_host()
    fingerprint = cluster.nodes[0].topology()["model"]["fingerprint"]
    fake = host.spawn([sys.executable, FAKE, "--interface", host.ip, "--fingerprint", fingerprint,
                       "--model-dir", str(model), *extra],
                      label=f"fake-{host.index}")
    return fake, fake.wait_event("ready", 60)["node_id"]


def node_log(node) -> str:
    return node.proc.stderr_log.read_text(errors="replace")


def test_a_member_that_never_serves_is_left_out(swarm, expected, llama):
    fake, fake_id = spawn_fake(swarm, llama)
    appeared = time.monotonic()
    try:
        # Fastest and biggest: the plan gives it layers, which it never loads.
        seen = wait_until(lambda: in_plan(swarm.nodes[0], fake_id), what="the black hole in the plan")
        back = served_again(swarm.nodes[0], expected)
        # (The plan before serves while a new plan's members are not all there yet: often at once.)
        left = wait_until(lambda: not in_plan(swarm.nodes[0], fake_id), timeout=60, what="the black hole left out")
        print(f"black hole in the plan -> the swarm served again {back - seen:.1f} s later "
              f"({back - appeared:.1f} s after its record appeared); left out of the plan {left - seen:.1f} s later")
        assert "did not serve plan" in node_log(swarm.nodes[0])
        for node in swarm.nodes:
            served_again(node, expected)
    finally:
        fake.terminate()
    swarm.wait_serving(stages=3)


def test_a_strangers_record_with_an_honest_nodes_id_wedges_nothing(swarm, expected, llama):
    victim = swarm.nodes[2]
    victim_id = victim.node_id
    # The fake is both at once: a record with an honest node's id, and a black hole (fast, never serves).
    fake, _ = spawn_fake(swarm, llama, "--node-id", victim_id, "--started-at", str(time.time() - 3600))
    appeared = time.monotonic()
    fake2 = None
    try:
        # The honest node is the later-started one: it takes a new id, every part of it anew.
        moved = wait_until(lambda: (victim.topology() or {}).get("node_id") not in (None, victim_id),
                           what="the honest node under a new id")
        new_id = victim.topology()["node_id"]
        back = served_again(swarm.nodes[0], expected)
        print(f"a duplicate id and a black hole: honest node re-minted {victim_id} -> {new_id} "
              f"{moved - appeared:.1f} s after the record appeared; the swarm served again {back - moved:.1f} s "
              f"later ({back - appeared:.1f} s in all)")
        wait_until(lambda: in_plan(swarm.nodes[0], new_id) and in_plan(victim, new_id), what="the new id planned")
        for node in swarm.nodes:  # through the re-minted node too: its links, lane and pipelines know the new id
            served_again(node, expected)
        status, health = victim.get("/health")
        assert health["node_id"] == new_id and health["layers"], health
        announces_only_what_it_serves(swarm)
        # The stranger follows it to its new id: it does not move again, and nothing wedges.
        fake2, _ = spawn_fake(swarm, llama, "--node-id", new_id, "--started-at", str(time.time() - 3600))
        wait_until(lambda: "not re-minting again" in node_log(victim), what="the node refusing to flap")
        assert victim.topology()["node_id"] == new_id
        for node in swarm.nodes:
            served_again(node, expected)
    finally:
        fake.terminate()
        if fake2 is not None:
            fake2.terminate()


def test_a_cloned_node_takes_a_new_id_and_serves(tmp_path, llama, expected):
    cluster = three_nodes(tmp_path, llama)
    try:
        original = cluster.nodes[0]
        original_id = original.node_id
        # A cloned machine: same machine id, same state dir path and inode, so the same stored id.
        clone = cluster.add_node(["--state-dir", str(cluster.root / "state0")])
        wait_until(lambda: clone.proc.popen.poll() is not None or "starts over" in node_log(clone), timeout=180,
                   what="the clone noticing the duplicate")
        noticed = time.monotonic()
        assert clone.proc.popen.poll() is None, node_log(clone)
        cluster.wait_serving(stages=4)
        back = served_again(clone, expected)
        print(f"clone of {original_id} noticed the duplicate; the swarm of 4 served again {back - noticed:.1f} s later")
        new_id = clone.topology()["node_id"]
        assert new_id != original_id and original.topology()["node_id"] == original_id
        for node in cluster.nodes:
            served_again(node, expected)
        announces_only_what_it_serves(cluster)

        # An id given by --node-id cannot be re-minted: the later node says so in one line and exits.
        dup = cluster.add_node(["--node-id", original_id])
        assert dup.proc.popen.wait(timeout=180) == 2
        errors = [line for line in dup.proc.stderr_log.read_text().splitlines() if line.startswith("swarm-node: error")]
        assert len(errors) == 1 and re.search(r"is also the id of another node", errors[0]), errors
        served_again(cluster.nodes[1], expected)
    finally:
        cluster.close()
