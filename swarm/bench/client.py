"""Timed streaming requests to a node's /v1/completions (SSE), one or several at once."""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class StreamRun:
    """One streamed completion, timed on the client."""
    text: str
    tokens: int  # completion tokens, from the usage chunk
    ttft_s: float  # request sent -> first token's chunk
    decode_s: float  # first token's chunk -> last chunk
    wall_s: float  # request sent -> stream closed
    token_ids: list[int] | None = None  # the generated ids (EOS too), or None from a node that gives none

    @property
    def decode_tps(self) -> float | None:
        return (self.tokens - 1) / self.decode_s if self.tokens > 1 and self.decode_s > 0 else None


def stream_completion(url: str, prompt: str, max_tokens: int, timeout: float = 600.0,
                      start: threading.Barrier | None = None, token_ids: bool = True) -> StreamRun:
    """One greedy stream; with `start`, connected first and sent when every party of the barrier is.
    `token_ids`: ask for the generated ids too (return_token_ids); a node of a build that refuses the
    field is asked again without it (its run then carries text only)."""
    try:
        return _stream_completion(url, prompt, max_tokens, timeout, start, token_ids and url not in _REFUSE_IDS)
    except IdsRefused:
        _REFUSE_IDS.add(url)  # (asked once: later streams to it, timed, ask without)
        return _stream_completion(url, prompt, max_tokens, timeout, None, False)


_REFUSE_IDS: set[str] = set()  # nodes that refused return_token_ids


class IdsRefused(RuntimeError):
    """The node refused return_token_ids (a build before it)."""


def _stream_completion(url: str, prompt: str, max_tokens: int, timeout: float, start: threading.Barrier | None,
                       token_ids: bool) -> StreamRun:
    fields = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
              "stream_options": {"include_usage": True}}
    body = json.dumps({**fields, "return_token_ids": True} if token_ids else fields)
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    if start is not None:
        try:
            conn.connect()
        except BaseException:
            start.abort()  # the other clients and the caller stop waiting for this one
            raise
        start.wait()
    parts: list[str] = []
    ids: list[int] | None = [] if token_ids else None
    tokens, t_first, t_last = 0, None, None
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status == 400 and token_ids:
            refusal = resp.read()[:500]
            if b"return_token_ids" in refusal:
                raise IdsRefused(refusal)
            raise RuntimeError(f"{url}: HTTP 400: {refusal!r}")
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {resp.read()[:500]!r}")
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"{url}: {event['error']}")
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                if ids is not None:
                    ids += choice.get("token_ids") or []
                if choice.get("text"):
                    parts.append(choice["text"])
                    t_last = time.perf_counter()
                    t_first = t_first or t_last
        t_end = time.perf_counter()
    finally:
        conn.close()
    if t_first is None:
        raise RuntimeError(f"{url}: the stream carried no text")
    return StreamRun("".join(parts), tokens, t_first - t0, t_last - t_first, t_end - t0, ids)


def concurrent_completions(url: str, prompts: list[str], max_tokens: int) -> tuple[float, list[StreamRun]]:
    """A stream per prompt, started together; (wall seconds from their start to the last end, runs).

    Each client has its thread and its connection before any request leaves, and all leave at once:
    mlx-lm's batch generation, which these rounds are compared with, has its n prompts at once too.
    (Started as the threads came up, the requests would reach the node spread over several ms, on a
    machine the node's first prompt pass already keeps busy.)"""
    t0: list[float] = []
    n = len(prompts)
    start = threading.Barrier(n + 1, action=lambda: t0.append(time.perf_counter()))
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(stream_completion, url, prompt, max_tokens, 600.0, start) for prompt in prompts]
        try:
            start.wait(timeout=60)
        except threading.BrokenBarrierError:
            for f in futures:  # a client that could not connect: its own error, not the barrier's
                if not isinstance(f.exception(), threading.BrokenBarrierError):
                    f.result()
            raise
        runs = [f.result() for f in futures]
        return time.perf_counter() - t0[0], runs
