"""A man in the middle between the nodes of a secret swarm (issue 19): it can alter and replay, never win.

Three nodes on separate hosts know each other only through relays on a fourth host
(static peers, no mDNS), so every byte between them passes the relays
(tests/tamper_proxy.py), which record each connection and can alter one frame.
An altered frame closes that link only, the request it carried completes with
mlx-lm's text over a re-dialed link (also when the link is between two stages and
not the entry's: they tell the entry, which replays), and a recorded session
replayed to a node is refused.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from helpers import chat_body
from netns import netns_unavailable_reason
from netns_client import in_netns
from reference import reference_chat
from stranger import replay
from swarm_cluster import PEER_PORT, SwarmCluster

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

TESTS = Path(__file__).resolve().parent
SECRET = "a secret the relay does not know 4b1d"
HANDSHAKE_BYTES = 1024  # more than a hello, its challenge, proof and refusal (about 400 bytes)


def relay_ip(index: int) -> str:
    return f"10.77.1.{101 + index}"


@pytest.fixture
def relayed_swarm(tmp_path, llama):
    peers = [[a for j in range(3) if j != i for a in ("--peer", f"{relay_ip(j)}:{PEER_PORT}")] for i in range(3)]
    cluster = SwarmCluster(tmp_path, 3, ["--model", str(llama), "--no-mdns"], peers, secret=SECRET)
    try:
        relay_host = cluster.network.add_host()
        for i in range(3):
            relay_host.exec("ip", "addr", "add", f"{relay_ip(i)}/24", "dev", "eth0")
        record = tmp_path / "recorded"
        record.mkdir()
        mappings = [f"{relay_ip(i)}:{PEER_PORT}={node.host.ip}:{PEER_PORT}" for i, node in enumerate(cluster.nodes)]
        relay = relay_host.spawn([sys.executable, str(TESTS / "tamper_proxy.py"), "--record", str(record),
                                  "--seconds", "400", *mappings], label="relay", stdin=True)
        relay.wait_event("ready", 20)
        cluster.wait_serving(stages=3, timeout=120)
        yield cluster, relay_host, relay, record, llama
    finally:
        cluster.close()


def data_connections(relay) -> dict[int, dict]:
    """conn number -> {"target", "closed"} for every data connection the relays saw."""
    conns: dict[int, dict] = {}
    for e in relay.events:
        if e.get("event") == "open" and e.get("purpose") == "data":
            conns[e["conn"]] = {"target": e["target"], "closed": False}
        elif e.get("event") == "close" and e.get("conn") in conns:
            conns[e["conn"]].update(closed=True, bytes=e.get("bytes"))
    return conns


def tamper_once(entry, relay, sender, receiver, question: str, expected: str) -> dict:
    """Alter the next frame of one position's hidden states (64 floats; the prompt's last token, prefilled
    on its own) on the link between `sender` and `receiver` (whichever of them dialed); the chat still
    answers mlx-lm's text."""
    mark = relay.mark()
    relay.send({"tamper": [300, 1000], "between": [sender.host.ip, receiver.host.ip]})
    started = time.monotonic()
    status, reply = entry.post("/v1/chat/completions", chat_body(question), timeout=90)
    took = time.monotonic() - started
    tampered = relay.wait_event("tampered", 5, mark)
    print(f"\ntampered a frame to {tampered['to']} (connection {tampered['conn']}): the chat took {took:.1f} s")
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"] == expected
    assert tampered["to"] == receiver.host.ip, tampered
    # Well within the token timeout (120 s): the entry was told and replayed at once.
    assert took < 60, f"the chat took {took:.0f} s: its entry waited out a lost frame"
    return tampered


def test_a_tampered_frame_closes_that_link_only_and_a_replayed_session_fails(relayed_swarm):
    cluster, relay_host, relay, record, model = relayed_swarm
    stages = cluster.nodes[0].topology()["plan"]["stages"]
    by_id = {n.node_id: n for n in cluster.nodes}
    entry, second, third = (by_id[s["node_id"]] for s in stages)
    question = "What is the capital of France?"
    expected, _ = reference_chat(model, chat_body(question)["messages"], 12)

    # The entry's link to the second stage (the entry sees its own link break), then the link between the
    # second and the third stage (only those two see it: they must tell the entry, or it waits 120 s).
    tampered = [tamper_once(entry, relay, entry, second, question, expected)["conn"],
                tamper_once(entry, relay, second, third, question, expected)["conn"]]
    time.sleep(1.0)
    conns = data_connections(relay)
    closed = sorted(n for n, c in conns.items() if c["closed"])
    print(f"data connections through the relays: {conns}; tampered: connections {tampered}")
    assert set(tampered) <= set(closed), f"closed: {closed}, tampered: {tampered}"
    # Besides them, only dials that crossed one the other way (after a link broke both ends may dial at
    # once: the lower id's connection stays, transport/links.py), which carried a handshake and no more.
    crossed = sum(n.proc.stderr_log.read_text().count("refused a second connection from") for n in cluster.nodes)
    refused = [n for n in closed if n not in tampered]
    assert len(refused) <= crossed and all(conns[n]["bytes"] < HANDSHAKE_BYTES for n in refused), \
        f"closed: {closed}, not just the tampered links ({crossed} crossed dials)"
    for receiver in (second, third):
        log = receiver.proc.stderr_log.read_text()
        assert "did not open" in log, log[-3000:]

    # Replay a recorded session (the first data connection not tampered with) straight to its node.
    victim_conn = min(n for n in conns if n not in tampered)
    target_ip = conns[victim_conn]["target"].rpartition(":")[0]
    captured = (record / f"conn-{victim_conn}.bin").read_bytes()
    replies, closed_by_node = in_netns(relay_host.ns, replay, target_ip, PEER_PORT, captured)
    kinds = [(h.get("t"), h.get("kind")) for h in replies]
    print(f"replayed {len(captured)} bytes of connection {victim_conn} to {target_ip}: answered {kinds}")
    assert closed_by_node, f"the node kept a replayed session open (answered {kinds})"
    assert replies and replies[-1].get("t") == "error" and replies[-1].get("kind") == "auth", kinds

    # Nothing else changed: the same links, the same text.
    status, reply = entry.post("/v1/chat/completions", chat_body(question), timeout=90)
    assert status == 200 and reply["choices"][0]["message"]["content"] == expected
    assert sorted(n for n, c in data_connections(relay).items() if c["closed"]) == closed
