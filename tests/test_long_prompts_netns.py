"""Long prompts share the swarm (issue 33): three nodes of the default model on netns hosts.

A long prompt is read in chunks (`--prefill-chunk`; not given here: the backend's default,
backend.py) that each stage interleaves with other requests' work, so a short chat sent beside
it is answered within 3x its quiet time (measured in the same test); the first-token deadline
follows the chunks' progress, so a prompt whose prefill outlasts `--token-timeout` completes;
and a client that leaves mid-prompt frees every node (no cached request, nothing prefilling)
within 2 s.

The nodes run with a 15 s token timeout (a prompt of thousands of tokens takes longer than that
to read on this CPU, alone in large chunks too: a fixed deadline would replay it) and without the prompt cache, so every
prompt is read from scratch. Long prompts are slow on a shared 2-core machine: one prompt of
5,500 tokens (the issue's 5,000 and 5,500) serves both the short chat's wait and the completion
on a loaded swarm.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from netns import netns_unavailable_reason
from netns_client import in_netns
from swarm_cluster import API_PORT, SwarmCluster

pytestmark = [pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason())),
              pytest.mark.timeout(1200)]

TOKEN_TIMEOUT_S = 15
QUESTION = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8,
            "temperature": 0}
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex bold jackdaws".split()
TOKENS_PER_WORD = 1.29  # of the texts below, with this tokenizer (measured on the chat's prompt_tokens)
FREED_WITHIN_S = 2.0


def long_chat(tokens: int, seed: int, max_tokens: int = 4) -> dict:
    """A chat whose user message is about `tokens` tokens long; distinct texts for distinct seeds."""
    words, i = [], seed
    for k in range(int(tokens / TOKENS_PER_WORD)):
        words.append(WORDS[i % len(WORDS)] + ("." if k % 11 == 0 else ""))
        i += 7
    text = f"Text number {seed}. " + " ".join(words) + "\nHow many words did the fox jump over?"
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    cluster = SwarmCluster(tmp_path_factory.mktemp("long-prompts"), 3,
                           ["--prompt-cache", "0", "--token-timeout", str(TOKEN_TIMEOUT_S),
                            "--recovery-timeout", "60"])
    try:
        client = cluster.network.add_host()
        cluster.wait_serving(stages=3, timeout=300)
        yield cluster, client
    finally:
        cluster.close()


def _post(client, node, body: dict, timeout: float = 900) -> tuple[int, dict, float]:
    from helpers import http_json
    t0 = time.monotonic()
    status, reply = in_netns(client.ns, http_json, f"http://{node.host.ip}:{API_PORT}/v1/chat/completions",
                             body, timeout)
    return status, reply, time.monotonic() - t0


def _quiet(client, node) -> tuple[float, str]:
    """The short chat's time alone (the best of three) and its text."""
    times, texts = [], set()
    for _ in range(3):
        status, reply, took = _post(client, node, QUESTION, 120)
        assert status == 200, reply
        times.append(took)
        texts.add(reply["choices"][0]["message"]["content"])
    assert len(texts) == 1, texts
    return min(times), texts.pop()


def _in_background(client, node, body: dict) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["status"], out["reply"], out["took"] = _post(client, node, body)
        except BaseException as e:  # handed to the test
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _plans(cluster) -> set:
    return {(t or {}).get("plan", {}).get("id") for t in (n.topology() for n in cluster.nodes)}


def test_a_short_chat_beside_a_5500_token_prompt_is_answered_within_3x_and_the_prompt_completes(swarm):
    """At the default chunk: a short chat sent 1 s after a 5,500-token prompt (more than the issue's
    5,000) is answered within 3x its quiet time. Then a second long prompt and short chats run beside
    it on another entry, and the prompt, whose prefill outlasts the token timeout, completes once: its
    first-token deadline follows its chunks (a fixed one replayed it)."""
    cluster, client = swarm
    entry, other = cluster.nodes[0], cluster.nodes[1]
    plans = _plans(cluster)
    assert len(plans) == 1 and None not in plans, plans
    quiet, text = _quiet(client, entry)

    thread, long = _in_background(client, entry, long_chat(5500, seed=1))
    time.sleep(1.0)
    status, reply, beside = _post(client, entry, QUESTION, 300)
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"] == text

    second, second_out = _in_background(client, other, long_chat(1000, seed=3))
    shorts = []
    while thread.is_alive() and len(shorts) < 6:
        status, reply, _ = _post(client, other, QUESTION, 300)
        assert status == 200, reply
        shorts.append(reply["choices"][0]["message"]["content"])
    thread.join(1100)
    second.join(300)
    for out in (long, second_out):
        assert "error" not in out, out.get("error")
        assert out["status"] == 200, out["reply"]
    print(f"short chat: {quiet:.2f}s alone, {beside:.2f}s beside a {long['reply']['usage']['prompt_tokens']}-token "
          f"prompt ({beside / quiet:.2f}x), which was answered in {long['took']:.1f}s "
          f"(token timeout {TOKEN_TIMEOUT_S}s)")
    assert 5400 <= long["reply"]["usage"]["prompt_tokens"] <= 6000, long["reply"]["usage"]
    assert beside <= 3 * quiet, f"{beside:.2f}s beside the long prompt, {quiet:.2f}s alone"
    assert long["took"] > TOKEN_TIMEOUT_S, long["took"]  # (else it proves nothing about the deadline)
    assert set(shorts) == {text}
    assert _plans(cluster) == plans  # honest nodes keep one view


def _leave_mid_prompt(host: str, body: dict, after_s: float) -> None:
    """Send a streaming chat, wait `after_s` (no answer comes yet: the prompt is being read), hang up."""
    conn = http.client.HTTPConnection(host, API_PORT, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                 {"Content-Type": "application/json"})
    time.sleep(after_s)
    conn.sock.close()
    conn.close()


def test_a_client_leaving_mid_prompt_frees_every_node_within_2s(swarm):
    cluster, client = swarm
    entry = cluster.nodes[0]
    quiet, text = _quiet(client, entry)
    seen_prefilling: list[int] = []

    def watch() -> None:
        time.sleep(3.0)
        status, health = entry.get("/health")
        seen_prefilling.append(health.get("prefilling"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    in_netns(client.ns, _leave_mid_prompt, entry.host.ip, long_chat(3000, seed=4), 4.0)
    left = time.monotonic()
    watcher.join()

    held = None
    while time.monotonic() - left < 30:
        healths = [n.get("/health")[1] for n in cluster.nodes]
        held = [(h.get("cached_requests"), h.get("active_requests"), h.get("prefilling")) for h in healths]
        if all(h == (0, 0, 0) for h in held):
            break
        time.sleep(0.1)
    freed = time.monotonic() - left
    print(f"every node free {freed:.2f}s after the client left")
    assert all(h == (0, 0, 0) for h in held), held
    assert freed <= FREED_WITHIN_S, f"the nodes held the request {freed:.2f}s after its client left"
    assert seen_prefilling == [1], seen_prefilling  # /health counted the prompt being read
    status, reply, took = _post(client, entry, QUESTION, 120)
    assert status == 200 and reply["choices"][0]["message"]["content"] == text, reply
    assert took <= 3 * quiet, f"{took:.2f}s after the client left, {quiet:.2f}s alone"
