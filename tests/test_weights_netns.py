"""Weights from peers on separate hosts: nodes that start with nothing fetch exactly their layers.

Only some hosts hold the default model (converted); the others start with its id and an
empty cache, fetch what their stage needs from the holders, and answer like one machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import chat_body, reply_text, streamed_text, wait_until
from netns import netns_unavailable_reason
from reference import reference_chat
from swarm_cluster import SwarmCluster

from swarm.models.resolve import DEFAULT_MODEL_ID
from swarm.models.manifest import cached_manifest
from swarm.weights.needs import stage_chunks, stage_tensor_names

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def fetching(cache: Path) -> list[str]:
    return ["--model", DEFAULT_MODEL_ID, "--cache-dir", str(cache)]


def chat_text(node, stream: bool = False) -> str:
    if stream:
        return streamed_text(node.stream("/v1/chat/completions", chat_body(QUESTION)))
    status, reply = node.post("/v1/chat/completions", chat_body(QUESTION))
    assert status == 200, reply
    return reply_text(reply)


def own_entry(node) -> dict:
    top = node.topology()  # None while the node is still learning its model
    return next((n for n in top["nodes"] if n["self"]), {}) if top else {}


def limit_egress(host, mbit: int) -> None:
    """Slow the host's own sends (tbf on its side of the veth), so a transfer lasts long enough to cut."""
    host.exec("tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", f"{mbit}mbit", "burst", "256kbit",
              "latency", "500ms")


def unlimit_egress(host) -> None:
    host.exec("tc", "qdisc", "del", "dev", "eth0", "root")


def test_hosts_with_nothing_fetch_only_their_layers_and_answer_like_one_machine(tmp_path, default_model):
    expected, _ = reference_chat(default_model.path, QUESTION, 12)
    joining = ["--join", "--cache-dir", str(tmp_path / "cache2")]  # no model named: whatever the swarm serves
    # A closed swarm, and a fourth host with the wrong secret that wants the model too.
    cluster = SwarmCluster(tmp_path, 4, [], [[], fetching(tmp_path / "cache1"), joining,
                                             fetching(tmp_path / "cache3")], secret="weights-test-secret", start=False)
    (tmp_path / "state3" / "secret").write_text("not-the-swarm-secret\n")
    for node in cluster.nodes:
        node.start()
    members, stranger = cluster.nodes[:3], cluster.nodes[3]
    try:
        cluster.wait_serving(stages=3, nodes=members, timeout=300)
        for node in members:
            assert chat_text(node) == expected
            assert chat_text(node, stream=True) == expected
        for node, cache in zip(members[1:], ("cache1", "cache2")):
            fetch = own_entry(node)["fetch"]
            print(f"node{node.index}: needed {fetch['needed_bytes'] / 1e6:.1f} MB, received "
                  f"{fetch['received_bytes'] / 1e6:.1f} MB ({fetch['received_bytes'] / fetch['needed_bytes']:.3f}x)")
            assert fetch["state"] == "done" and fetch["rejected"] == 0
            assert 0 < fetch["received_bytes"] <= 1.15 * fetch["needed_bytes"]
            assert fetch["needed_bytes"] < 0.6 * default_model.manifest.total_bytes  # a third of 30 layers
            on_disk = sum(f.stat().st_blocks * 512 for f in (tmp_path / cache).rglob("*") if f.is_file())
            assert on_disk <= 1.2 * fetch["needed_bytes"], "only the fetched chunks take disk space"
        # every node's topology shows the others' fetches too
        seen = {n["id"]: n["fetch"] for n in cluster.nodes[0].topology()["nodes"]}
        assert sum(1 for f in seen.values() if f and f["state"] == "done") >= 2
        # Weights go only to members: the stranger never got a byte, and nobody lists it.
        status, health = stranger.get("/health")
        assert status == 503 and health["fetch"]["state"] == "looking", health
        assert health["fetch"]["received_bytes"] == 0 and not any((tmp_path / "cache3").rglob("*.safetensors"))
        stranger_id = (tmp_path / "state3" / "node_id").read_text().strip()
        assert all(n["id"] != stranger_id for n in members[0].topology()["nodes"])
        cluster.wait_serving(stages=3, nodes=members, timeout=60)
        # A restart reads what it fetched from its cache: only chunks of its new stage it never held travel.
        # (The plan may give the returning node other layers: the others keep theirs, it is appended.)
        held_file = next((tmp_path / "cache1").rglob(".swarm-held"))
        held_before = set(json.loads(held_file.read_text())["chunks"])
        cluster.nodes[1].proc.kill9()
        cluster.nodes[1].start()
        cluster.wait_serving(stages=3, nodes=members, timeout=240)
        start, end = own_entry(cluster.nodes[1])["layers"]
        manifest = cached_manifest(default_model.path, tmp_path / "manifests")
        stage = stage_chunks(manifest, stage_tensor_names(default_model.path, start, end))
        lacking = sum(c.length for c in stage if c.index not in held_before)
        fetch = own_entry(cluster.nodes[1])["fetch"]
        print(f"restarted node1: layers [{start}, {end}) need {fetch['needed_bytes'] / 1e6:.1f} MB, "
              f"held {(fetch['needed_bytes'] - lacking) / 1e6:.1f} MB, received {fetch['received_bytes'] / 1e6:.1f} MB")
        assert fetch["received_bytes"] == lacking < fetch["needed_bytes"]
        assert chat_text(cluster.nodes[1]) == expected
    finally:
        cluster.close()


def test_a_holder_killed_mid_transfer_is_replaced_by_the_other(tmp_path, default_model):
    expected, _ = reference_chat(default_model.path, QUESTION, 12)
    cluster = SwarmCluster(tmp_path, 3, [], [[], [], fetching(tmp_path / "cache")], start=False)
    try:
        holders, fetcher = cluster.nodes[:2], cluster.nodes[2]
        for node in holders:
            limit_egress(node.host, 160)  # ~20 MB/s each: the fetch takes seconds, not milliseconds
            node.start()
        cluster.wait_serving(stages=2, nodes=holders, timeout=120)
        fetcher.start()
        wait_until(lambda: (own_entry(fetcher).get("fetch") or {}).get("done_bytes", 0) > 20e6, 120,
                   "the fetch under way")
        under_way = own_entry(fetcher)["fetch"]
        assert under_way["state"] == "fetching" and under_way["done_bytes"] < under_way["total_bytes"]
        holders[1].proc.kill9()
        unlimit_egress(holders[0].host)  # the kill landed mid-transfer: the rest need not crawl
        cluster.wait_serving(stages=2, nodes=[holders[0], fetcher], timeout=240)
        # The two-stage plan may give the fetcher more layers than the three-stage one it fetched for:
        # it fetches those too (the plan before serves meanwhile), and is done.
        wait_until(lambda: own_entry(fetcher)["fetch"]["state"] == "done", 240, "the fetch done")
        assert chat_text(fetcher) == expected and chat_text(holders[0]) == expected
    finally:
        cluster.close()


def test_tampered_bytes_are_refused_and_fetched_from_an_honest_holder(tmp_path, default_model):
    expected, _ = reference_chat(default_model.path, QUESTION, 12)
    # A holder whose files were altered after its manifest was made: it still names the true
    # fingerprint (its manifest is cached) but serves wrong bytes for every weight chunk.
    liar_dir = tmp_path / DEFAULT_MODEL_ID
    shutil.copytree(default_model.path, liar_dir)
    liar_cache = tmp_path / "liar-cache"
    manifest = cached_manifest(liar_dir, liar_cache / ".manifests")
    assert manifest.fingerprint == default_model.fingerprint
    weights = liar_dir / "model.safetensors"
    stat = weights.stat()
    with open(weights, "r+b") as f:
        for chunk in manifest.chunks:
            if chunk.tensor:
                f.seek(chunk.offset)
                byte = f.read(1)
                f.seek(chunk.offset)
                f.write(bytes([byte[0] ^ 0xFF]))
    import os
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    liar = ["--model", str(liar_dir), "--cache-dir", str(liar_cache), "--memory-limit", "1M"]  # holds no layer
    cluster = SwarmCluster(tmp_path, 3, [], [[], liar, fetching(tmp_path / "cache")])
    try:
        cluster.wait_serving(stages=2, nodes=[cluster.nodes[0], cluster.nodes[2]], timeout=300)
        fetch = own_entry(cluster.nodes[2])["fetch"]
        print(f"fetcher refused {fetch['rejected']} chunks from the altered holder")
        assert fetch["rejected"] >= 1 and fetch["state"] == "done"
        assert chat_text(cluster.nodes[2]) == expected, "nothing unverified was loaded"
        assert "served bad bytes" in cluster.nodes[2].proc.logs(400)
    finally:
        cluster.close()
