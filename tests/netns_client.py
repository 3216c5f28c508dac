"""Run client code (HTTP requests, the openai client) inside a test host's network namespace.

A network namespace belongs to a thread, not a process: a fresh thread that
setns()-es into the host's namespace opens sockets there, while the test
process itself stays in the default namespace.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, TypeVar

from helpers import streamed_text

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def in_netns(ns: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {ns} failed")
            finally:
                os.close(fd)
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller's thread
            result["error"] = e

    t = threading.Thread(target=target, name=f"netns-{ns}")
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def sse_events(url: str, body: dict, timeout: float = 300) -> list[dict]:
    """POST a streaming request and collect its data events (until [DONE])."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            if line.startswith(b"data: "):
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    break
                events.append(json.loads(payload))
    return events


def sse_into(url: str, body: dict, sink: list, timeout: float = 300) -> None:
    """Stream a request, appending (arrival time, event) to `sink` as events come.

    An {"error": ...} event or a broken connection is appended too, as ("error", ...)."""
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r:
                if line.startswith(b"data: "):
                    payload = line[6:].strip()
                    if payload == b"[DONE]":
                        sink.append((time.monotonic(), "[DONE]"))
                        return
                    sink.append((time.monotonic(), json.loads(payload)))
    except (OSError, ValueError) as e:
        sink.append((time.monotonic(), {"error": {"message": f"connection: {e}"}}))


class Stream:
    """A streaming chat request running in the background, recording when each event arrived."""

    def __init__(self, node, body: dict):
        self.events: list = []
        self.thread = threading.Thread(target=in_netns, daemon=True,
                                       args=(node.host.ns, sse_into, node.url + "/v1/chat/completions",
                                             body, self.events))
        self.thread.start()

    def wait_tokens(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while sum(1 for _, e in self.events if isinstance(e, dict) and e.get("choices")) < n:
            assert time.monotonic() < deadline, f"stream stalled: {self.events[-3:]}"
            assert self.thread.is_alive() or self.done, "stream ended early"
            time.sleep(0.05)

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1][1] == "[DONE]"

    def finish(self, timeout: float = 180) -> str:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "stream did not finish"
        errors = [e for _, e in self.events if isinstance(e, dict) and "error" in e]
        assert not errors, errors
        assert self.done
        return streamed_text(e for _, e in self.events if isinstance(e, dict))

    def gap_after(self, t: float) -> float:
        """Seconds from t to the next event (the recovery time after a death at t)."""
        return next(at for at, _ in self.events if at > t) - t
