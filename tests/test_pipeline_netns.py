"""The pipeline across 3 real hosts: a model split over 3 nodes answers like one machine."""

from __future__ import annotations

import concurrent.futures
import socket

import pytest
from discovery.memory import parse_size
from helpers import chat_body, streamed_text
from netns import netns_unavailable_reason
from netns_client import in_netns
from reference import reference_chat
from swarm_cluster import PEER_PORT, SwarmCluster

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

QUESTIONS = ["What is the capital of France?", "Name a colour.", "Count to five.", "Say hello in Spanish."]


def test_default_model_split_over_three_nodes(default_swarm):
    topology = default_swarm.nodes[0].topology()
    stages = topology["plan"]["stages"]
    assert [s["start"] for s in stages][0] == 0 and stages[-1]["end"] == 30
    assert all(a["end"] == b["start"] for a, b in zip(stages, stages[1:]))
    assert len({s["node_id"] for s in stages}) == 3
    # Every node reports the layers the plan gives it, and holds only those.
    for node in default_swarm.nodes:
        status, health = node.get("/health")
        mine = next(s for s in stages if s["node_id"] == health["node_id"])
        assert status == 200 and health["layers"] == [mine["start"], mine["end"]]
    shown = {n["id"]: n for n in topology["nodes"]}
    assert all(shown[s["node_id"]]["layers"] == [s["start"], s["end"]] for s in stages)


def test_each_node_answers_like_one_machine(default_swarm, default_model):
    question = QUESTIONS[0]
    expected, n_tokens = reference_chat(default_model.path, chat_body(question, 12)["messages"], 12)
    for node in default_swarm.nodes:
        status, reply = node.post("/v1/chat/completions", chat_body(question, 12))
        assert status == 200, reply
        assert reply["choices"][0]["message"]["content"] == expected
        assert reply["usage"]["completion_tokens"] == n_tokens
        assert len(reply["swarm"]["path"]) == 3


def test_concurrent_streams_all_match_one_machine(default_swarm, default_model):
    expected = {q: reference_chat(default_model.path, chat_body(q, 10)["messages"], 10)[0] for q in QUESTIONS}
    nodes = default_swarm.nodes

    def run(i: int) -> tuple[str, str]:
        events = nodes[i % 3].stream("/v1/chat/completions", chat_body(QUESTIONS[i], 10))
        return QUESTIONS[i], streamed_text(events)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(4)))
    for question, text in results:
        assert text == expected[question], question


def send_garbage(ip: str) -> None:
    payloads = [b"\x00\xff" * 512, b"SWRM" + b"\xff" * 64, b"SWRM\x00\x00\x00\x05\x7f\xff\xff\xffhello",
                b"SWPF", b"GET / HTTP/1.1\r\n\r\n", b"SWRM\xff\xff\xff\xff\xff\xff\xff\xff"]
    for data in payloads:
        with socket.create_connection((ip, PEER_PORT), timeout=5) as s:
            s.sendall(data)
            s.settimeout(2)
            try:
                while s.recv(4096):
                    pass
            except (socket.timeout, ConnectionResetError):
                pass


def test_garbage_on_a_peer_port_leaves_the_swarm_serving(default_swarm, default_model):
    target = default_swarm.nodes[1]
    in_netns(target.host.ns, send_garbage, target.host.ip)
    expected, _ = reference_chat(default_model.path, chat_body(QUESTIONS[1], 6)["messages"], 6)
    status, reply = default_swarm.nodes[0].post("/v1/chat/completions", chat_body(QUESTIONS[1], 6))
    assert status == 200 and reply["choices"][0]["message"]["content"] == expected
    assert default_swarm.wait_serving(stages=3, timeout=10)


def test_another_family_over_three_nodes(tmp_path, tiny_models):
    model = tiny_models["qwen3"]
    cluster = SwarmCluster(tmp_path, 3, ["--model", str(model)])
    try:
        topology = cluster.wait_serving(stages=3)
        assert topology["plan"]["n_layers"] == 6
        for i, node in enumerate(cluster.nodes):
            messages = [{"role": "user", "content": f"hello {i}"}]
            expected, n = reference_chat(model, messages, 20)
            status, reply = node.post("/v1/chat/completions", {"messages": messages, "max_tokens": 20,
                                                               "temperature": 0})
            assert status == 200 and reply["choices"][0]["message"]["content"] == expected
            assert reply["usage"]["completion_tokens"] == n
    finally:
        cluster.close()


def test_memory_limits_change_the_layer_ranges(tmp_path, tiny_models):
    # A layer of this model is ~1.14 MiB with its KV reserve: 1.3M holds exactly one
    # layer (plus the embedding or head), so the roomy node must take the other four or more.
    model = tiny_models["llama"]
    limits = ["64M", "1.3M", "1.3M"]
    cluster = SwarmCluster(tmp_path, 3, ["--model", str(model)], [["--memory-limit", m] for m in limits])
    try:
        topology = cluster.wait_serving()
        spec, stages = topology["plan"]["spec"], topology["plan"]["stages"]
        ids = [n.node_id for n in cluster.nodes]
        held = {s["node_id"]: s["end"] - s["start"] for s in stages}
        counts = [held.get(i, 0) for i in ids]
        layer_bytes = spec["bytes_per_layer"] + spec["kv_bytes_per_token_per_layer"] * spec["context_tokens"]
        caps = [parse_size(m) for m in limits]
        assert all(c * layer_bytes <= cap for c, cap in zip(counts, caps)), (counts, layer_bytes)
        assert counts[0] >= 4 and counts[1] <= 1 and counts[2] <= 1 and sum(counts) == 6, counts
        shown = {n["id"]: n["memory_available"] for n in topology["nodes"]}
        assert [shown[i] for i in ids] == caps
    finally:
        cluster.close()


TYPOS = ("Fix the typos in this paragraph: The city council met on Tuesday to discuss the new park. Many residents "
         "came to share their views about the playground, the trees and the parking. The mayor said the plan would be "
         "ready by the end of the yaer, and that work would start in the spring.")


def test_drafts_checked_across_three_hosts_give_one_machines_text(default_swarm, default_model):
    """A copy-and-fix answer: prompt lookup drafts most of it, the last host checks the drafts, every host
    cuts back what it rejected; the text is mlx-lm's greedy text, with drafts and without."""
    body = chat_body(TYPOS, 60)
    expected, n_tokens = reference_chat(default_model.path, body["messages"], 60)
    entry = default_swarm.nodes[0]
    before = entry.get("/health")[1]["speculation"]
    status, on = entry.post("/v1/chat/completions", body)
    assert status == 200, on
    after = entry.get("/health")[1]["speculation"]
    status, off = entry.post("/v1/chat/completions", {**body, "speculate": False})
    assert status == 200, off
    assert on["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"] == expected
    assert on["usage"]["completion_tokens"] == n_tokens
    assert after["drafts_accepted"] - before["drafts_accepted"] > n_tokens // 3, (before, after)
