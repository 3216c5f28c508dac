"""Plain helpers the tests share, one copy each (imported by name; the fixtures live in conftest.py).

    from helpers import chat_body, wait_until
    status, reply = node.post("/v1/chat/completions", chat_body("Name a colour.", 8))
    wait_until(lambda: node.topology() is not None, 60, "the node's topology")
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterable

import openai

from discovery import Discovery, NodeProfile, serve_liveness_port
from swarm.bench.cluster import free_port

# The families of the session's tiny random-weight models (conftest's `tiny_models`).
TINY_FAMILIES = ("llama", "qwen2", "qwen3")
TINY_SHAPE = {"n_layers": 6, "seed": 1}
# A qwen3 wide enough that a step takes a few ms (steps of other requests queue behind it),
# and a narrow one that makes many cheap in-process steps.
WIDE_QWEN3 = {"family": "qwen3", "n_layers": 6, "hidden": 256, "heads": 8, "kv_heads": 2, "intermediate": 768,
              "seed": 7}
NARROW_SHAPE = {"n_layers": 6, "hidden": 128, "heads": 4, "kv_heads": 2, "intermediate": 256, "seed": 7}


def chat_body(question: str | list[dict], max_tokens: int = 12, **fields: Any) -> dict:
    """A greedy chat completion request: one user message (or the messages given), plus any other fields."""
    messages = [{"role": "user", "content": question}] if isinstance(question, str) else question
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **fields}


def reply_text(reply: dict) -> str:
    """The text of a non-streamed chat completion's first choice."""
    return reply["choices"][0]["message"]["content"]


def streamed_text(events: Iterable[dict]) -> str:
    """The text of a stream's data events (as SwarmNode.stream returns them): chat deltas or completion text."""
    def piece(choice: dict) -> str:
        return (choice.get("delta") or {}).get("content") or choice.get("text") or ""
    return "".join(piece(e["choices"][0]) for e in events if e.get("choices"))


def http_json(url: str, body: dict | None = None, timeout: float = 120,
              headers: dict | None = None) -> tuple[int, dict]:
    """GET `url`, or POST it a JSON body: (status, JSON answer), an error status included."""
    return _answer(url, json.dumps(body).encode() if body is not None else None, headers or {}, timeout)


def post_raw(node, path: str, body: bytes, headers: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    """POST these exact bytes to a node's API: (status, JSON answer), an error status included."""
    return _answer(node.url + path, body, headers or {}, timeout)


def _answer(url: str, data: bytes | None, headers: dict, timeout: float) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def streamed_answer(chunks) -> dict:
    """The openai client's streamed chat chunks put together as its users do: content, tool calls by index,
    finish reason, logprobs."""
    out: dict = {"content": "", "calls": {}, "finish": None, "logprobs": []}
    for c in chunks:
        for ch in c.choices:
            out["content"] += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                call = out["calls"].setdefault(tc.index, {"name": "", "arguments": "", "id": None})
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
                call["id"] = call["id"] or tc.id
            if ch.logprobs and ch.logprobs.content:
                out["logprobs"] += ch.logprobs.content
            out["finish"] = ch.finish_reason or out["finish"]
    return out


def openai_client(url: str, key: str = "none", timeout: float = 120) -> openai.OpenAI:
    """The official client for a node's API at `url` (no retries: a test sees the first answer)."""
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=timeout)


def wait_until(condition: Callable[[], Any], timeout: float = 120, what: str = "") -> float:
    """Poll `condition` until it holds; the monotonic time it held at. Fails the test past `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what or condition}"
        time.sleep(0.1)
    return time.monotonic()


async def eventually(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "", *,
                     blocking: bool = False) -> None:
    """Await until `predicate` holds, letting the event loop run between tries; fails past `timeout` s.

    `blocking`: the predicate blocks (an HTTP request, say): it runs in a thread, so that peers this loop
    serves (a PeerNode's listener) keep answering meanwhile."""
    deadline = time.monotonic() + timeout
    while not (await asyncio.to_thread(predicate) if blocking else predicate()):
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what or predicate}"
        await asyncio.sleep(0.02)


def read_stream_events(sock: socket.socket, marker: bytes, count: int) -> bytes:
    """What a streamed HTTP answer sent on `sock` until `marker` was seen `count` times; fails, with the
    end of what it saw, when the answer ends first (a long answer is the test's to ask for)."""
    sock.settimeout(120)
    seen = b""
    while seen.count(marker) < count:
        got = sock.recv(4096)
        seen += got
        assert got and not seen.endswith(b"\r\n0\r\n\r\n"), f"the stream ended early: {seen[-600:]!r}"
    return seen


def assert_gone_mid_stream_frees(node, path: str, body: dict, marker: bytes) -> None:
    """A client that reads a few events and hangs up: the node forgets the request on every stage."""
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", node.api_port)) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n".encode()
                  + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        read_stream_events(s, marker, 5)
        assert node.health()[1]["active_requests"] == 1

    def freed() -> bool:
        health = node.health()[1]
        return health["active_requests"] == 0 and health["cached_requests"] == 0
    wait_until(freed, 30, "the request freed on every stage")


def free_ports(n: int) -> list[int]:
    """`n` loopback ports free a moment ago, none handed out before in this process (bench's free_port)."""
    return [free_port() for _ in range(n)]


async def start_static_discovery(profile: NodeProfile, peers: list[int], on_event=None) -> tuple[Discovery,
                                                                                                 asyncio.Server]:
    """A Discovery of static peers on loopback (no zeroconf) at `profile.peer_port`, its liveness port
    served, started; the caller stops both."""
    discovery = Discovery(profile, mdns=False, interfaces=["127.0.0.1"],
                          static_peers=[("127.0.0.1", p) for p in peers], on_event=on_event)
    server = await serve_liveness_port("127.0.0.1", profile.peer_port, lambda: discovery.profile)
    await discovery.start()
    return discovery, server
