"""A secret swarm of three on separate hosts, and a stranger host beside them (issue 19).

The stranger has no secret, or a wrong one. Whatever it tries (a rogue mDNS record with a
profile responder, real `swarm-node`s of its own, hellos, hostile frames on every port,
thousands of connections) it never appears in a plan or a topology, and the swarm's
text stays equal to mlx-lm's. The secret reaches the honest nodes through their state
dirs' `secret` files (a build that knows no secret simply runs open: these tests then
show what a stranger could do to it).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import sys
import time
from pathlib import Path

import pytest
from discovery.profile import PROTOCOL_VERSION
from helpers import chat_body, http_json
from netns import netns_unavailable_reason
from netns_client import in_netns
from reference import reference_chat
from stranger import flood, frame, hello, hello_session, send_and_close
from swarm_cluster import API_PORT, PEER_PORT, TEST_SPEED, serving_swarm

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

TESTS = Path(__file__).resolve().parent
SECRET = "correct horse battery staple, but longer: 6f1c2b9e"
ROGUE_ID = "rogue-0000"


@pytest.fixture(scope="module")
def secret_swarm(tmp_path_factory, llama):
    """(cluster of 3 with the secret, the stranger host, the model)."""
    root = tmp_path_factory.mktemp("secret-swarm")
    with serving_swarm(root, 3, ["--model", str(llama)], stages=3, timeout=120, strangers=1,
                       secret=SECRET) as cluster:
        yield cluster, cluster.strangers[0], llama


def plan_and_members(cluster) -> list[tuple[str, set[str], set[str]]]:
    """(plan id, node ids in the topology, node ids in the plan) as each honest node sees it."""
    out = []
    for node in cluster.nodes:
        top = node.topology() or {}
        plan = top.get("plan") or {}
        out.append((plan.get("id"), {n["id"] for n in top.get("nodes", [])},
                    {s["node_id"] for s in plan.get("stages", [])}))
    return out


def assert_text_unchanged(cluster, model, question: str = "What is the capital of France?") -> None:
    expected, _ = reference_chat(model, chat_body(question)["messages"], 12)
    for node in cluster.nodes:
        status, reply = node.post("/v1/chat/completions", chat_body(question), timeout=60)
        assert status == 200, reply
        assert reply["choices"][0]["message"]["content"] == expected


def honest_ids(cluster) -> set[str]:
    return {n.node_id for n in cluster.nodes}


def test_a_rogue_record_and_profile_responder_never_enter_a_plan(secret_swarm):
    cluster, stranger, model = secret_swarm
    top = cluster.nodes[0].topology()
    plan_before = top["plan"]["id"]
    rogue = stranger.spawn([sys.executable, str(TESTS / "hostile_peer.py"), "--ip", stranger.ip,
                            "--swarm", top["swarm"], "--fingerprint", top["model"]["fingerprint"],
                            "--model-id", top["model"]["id"], "--node-id", ROGUE_ID, "--seconds", "90"],
                           label="rogue")
    rogue.wait_event("ready", 20)
    started = time.monotonic()
    try:
        while time.monotonic() - started < 12:  # today's nodes gave it every layer within 6 s
            for plan_id, members, staged in plan_and_members(cluster):
                if ROGUE_ID in members | staged:
                    layers = [n.get("layers") for n in cluster.nodes[0].topology()["nodes"] if n["id"] == ROGUE_ID]
                    pytest.fail(f"the rogue entered the swarm {time.monotonic() - started:.1f} s after it "
                                f"advertised itself: plan {plan_id}, stages {staged}, its layers {layers}")
            time.sleep(0.3)
        # The nodes did see its record and tried its endpoint: a hint, followed and refused.
        assert any(e["event"] == "hello" for e in rogue.events), "the rogue's record was not even tried"
        assert all(p == plan_before and s == honest_ids(cluster) for p, _, s in plan_and_members(cluster))
        assert_text_unchanged(cluster, model)
    finally:
        rogue.terminate()


def start_stranger_node(cluster, stranger, label: str, api_port: int, peer_port: int, model,
                        env: dict | None = None):
    argv = [sys.executable, "-m", "swarm.cli", "--interface", stranger.ip, "--name", label,
            "--state-dir", str(cluster.root / f"state-{label}"), "--api-port", str(api_port),
            "--peer-port", str(peer_port), "--speed", TEST_SPEED, "--model", str(model)]
    return stranger.spawn(argv, env={"OPENBLAS_NUM_THREADS": "1", **(env or {})}, label=label)


def test_stranger_nodes_without_the_secret_or_with_another_never_join_and_say_why_once(secret_swarm):
    cluster, stranger, model = secret_swarm
    plan_before = cluster.nodes[0].topology()["plan"]["id"]
    strangers = [("open-stranger", 8810, 8811, {}), ("other-secret", 8820, 8821, {"SWARM_SECRET": "not the secret"})]
    procs = [start_stranger_node(cluster, stranger, label, api, peer, model, env)
             for label, api, peer, env in strangers]
    try:
        # Each stranger serves alone (it holds the whole tiny model), so it is up and browsing.
        stranger_ids = []
        for (label, api, _, _), proc in zip(strangers, procs):
            deadline = time.monotonic() + 90
            while True:
                assert proc.popen.poll() is None, proc.logs()
                try:
                    status, health = in_netns(stranger.ns, http_json, f"http://{stranger.ip}:{api}/health", None, 5)
                    if status == 200:
                        stranger_ids.append(health["node_id"])
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"{label} never served alone:\n{proc.logs()}"
                time.sleep(0.5)
        watched = time.monotonic()
        while time.monotonic() - watched < 10:
            for plan_id, members, staged in plan_and_members(cluster):
                assert not set(stranger_ids) & (members | staged), f"a stranger joined: {members}, plan {staged}"
                assert plan_id == plan_before
            for (label, api, _, _) in strangers:
                status, top = in_netns(stranger.ns, http_json, f"http://{stranger.ip}:{api}/v1/topology", None, 5)
                assert {n["id"] for n in top["nodes"]}.isdisjoint(honest_ids(cluster)), f"{label} sees the swarm"
            time.sleep(0.5)
        assert_text_unchanged(cluster, model)
        # Why they never connect is said once per peer and reason, on both sides, and leaks nothing.
        for node in cluster.nodes:
            log = node.proc.stderr_log.read_text()
            about = [line for line in log.splitlines() if stranger.ip in line and "WARNING" in line]
            print(f"node{node.index} on the strangers:", *about, sep="\n  ")
            assert 1 <= len(about) <= 8, about
            assert SECRET not in log
        for proc in procs:
            log = proc.stderr_log.read_text()
            assert re.search(r"secret", log, re.I), f"{proc.label} never says why:\n{log[-3000:]}"
            assert SECRET not in log
    finally:
        for proc in procs:
            proc.terminate()


def test_a_strangers_hello_is_refused(secret_swarm):
    cluster, stranger, _ = secret_swarm
    swarm = cluster.nodes[0].topology()["swarm"]
    for node in cluster.nodes:
        for how in ({"nonce": False}, {"nonce": True, "proof_key": b"a wrong secret"}, {"nonce": True}):
            replies, closed = in_netns(stranger.ns, hello_session, node.host.ip, PEER_PORT, swarm, PROTOCOL_VERSION,
                                       **how)
            kinds = [(h.get("t"), h.get("kind")) for h in replies]
            assert closed, f"{how}: the node kept the stranger's connection open after {kinds}"
            if how.get("proof_key") or not how["nonce"]:  # refused, saying why
                assert replies and replies[-1].get("t") == "error" and replies[-1].get("kind") == "auth", kinds
            else:  # it proved itself and waited for a proof that never came: closed at the handshake timeout
                assert kinds == [("hello", None)], kinds
            assert len([k for k in kinds if k[0] == "hello"]) <= 1 and len(kinds) <= 2, kinds


def hostile_frames(plan_id: str, entry: str) -> bytes:
    """Well-formed frames of today's protocol that hurt a node that takes them."""
    ids = (100_000_000).to_bytes(4, "little", signed=True) * 4
    return b"".join([
        frame({"t": "fwd", "rid": "r-stranger", "plan": plan_id, "pos": 0, "start": 0, "entry": entry,
               "sampling": None, "cu": 0, "dtype": "int32", "shape": [1, 4]}, ids),
        frame({"t": "tok", "rid": "r-stranger", "plan": plan_id, "at": 5, "token": 7, "cu": 0}),
        frame({"t": "err", "rid": "r-stranger", "plan": plan_id, "kind": "cache", "message": "x"}),
        frame({"t": "rel", "rid": "r-stranger"}),
    ])


def test_frames_a_stranger_sends_on_any_port_change_nothing(secret_swarm):
    cluster, stranger, model = secret_swarm
    top = cluster.nodes[0].topology()
    swarm, plan_id = top["swarm"], top["plan"]["id"]
    entry = cluster.nodes[0].node_id
    frames = hostile_frames(plan_id, entry)
    for node in cluster.nodes:
        ip = node.host.ip
        # after a hello without a secret, after one with a wrong proof, claiming an honest node's id
        for how in ({"nonce": False}, {"nonce": True, "proof_key": b"wrong"},
                    {"nonce": False, "node_id": entry}, {"nonce": True, "proof_key": b"wrong", "node_id": entry}):
            in_netns(stranger.ns, hello_session, ip, PEER_PORT, swarm, PROTOCOL_VERSION, then=frames, wait=2.0, **how)
        # without any hello, as a plain profile request's tail, and on the API port
        for data in (b"SWRM" + frames, frames, b"SWPF" + frames, b"SWRM" + hello("x", swarm, PROTOCOL_VERSION) + frames):
            for port in (PEER_PORT, API_PORT):
                in_netns(stranger.ns, send_and_close, ip, port, data)
    for node in cluster.nodes:
        assert node.proc.popen.poll() is None, f"node{node.index} died:\n{node.proc.logs()}"
    assert all(p == plan_id for p, _, _ in plan_and_members(cluster))
    assert_text_unchanged(cluster, model)


def test_a_plain_profile_request_gets_no_profile(secret_swarm):
    cluster, stranger, _ = secret_swarm

    def ask(ip: str) -> bytes:
        import socket
        with socket.create_connection((ip, PEER_PORT), timeout=5) as s:
            s.sendall(b"SWPF")
            s.settimeout(5)
            data = b""
            try:
                while chunk := s.recv(65536):
                    data += chunk
            except OSError:
                pass
            return data

    for node in cluster.nodes:
        answer = in_netns(stranger.ns, ask, node.host.ip)
        assert b"memory_available" not in answer and b"node_id" not in answer, answer[:200]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_two_thousand_connections_leave_a_node_serving_with_bounded_descriptors(secret_swarm):
    cluster, stranger, model = secret_swarm
    target = cluster.nodes[1]
    swarm = cluster.nodes[0].topology()["swarm"]
    pid = target.proc.pid
    before = open_fds(pid)
    peak = [before]

    def sample() -> None:
        peak[0] = max(peak[0], open_fds(pid))

    question = "Name a colour."
    expected, _ = reference_chat(model, chat_body(question)["messages"], 12)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        flooding = pool.submit(in_netns, stranger.ns, flood, target.host.ip, PEER_PORT, swarm, PROTOCOL_VERSION,
                               2000, 12.0, sample)  # opened in a few s, then held past every hello timeout
        time.sleep(3)  # into the flood
        replies = []
        while not flooding.done():
            status, reply = target.post("/v1/chat/completions", chat_body(question), timeout=60)
            replies.append((status, reply))
            sample()
            time.sleep(1)
        counts = flooding.result()
    after = open_fds(pid)
    print(f"\n2,000 connections at node{target.index}: {counts}; its descriptors: {before} before, "
          f"{peak[0]} at most during the flood, {after} after; {len(replies)} chats during it")
    assert target.proc.popen.poll() is None
    assert counts["opened"] + counts["refused"] >= 1000, counts
    # At most 32 held per address, plus what asyncio accepts in a round before they are closed (100 a round;
    # a loaded machine closes them late: 376 seen in a clean-clone CI run). Unbounded, the node would hold all
    # 2,000 and hit its limit of 1,024. The same bound as test_connection_flood's.
    assert peak[0] <= before + 512, f"descriptors grew from {before} to {peak[0]}"
    assert after <= before + 5, f"descriptors {before} before, {after} after"
    assert replies and all(s == 200 and r["choices"][0]["message"]["content"] == expected for s, r in replies)
    log = target.proc.stderr_log.read_text()
    assert log.count("Traceback") < 20, "the flood filled the log with tracebacks"
    assert_text_unchanged(cluster, model)
    cluster.wait_serving(stages=3, timeout=30)
