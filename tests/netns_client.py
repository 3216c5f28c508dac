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
import urllib.error
import urllib.request
from typing import Any, Callable, TypeVar

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


def http_json(url: str, body: dict | None = None, timeout: float = 120,
              headers: dict | None = None) -> tuple[int, dict]:
    """GET (or POST a JSON body) from inside the current thread's namespace."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


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
    import time
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


def stream_text(events: list) -> str:
    def piece(choice: dict) -> str:
        return (choice.get("delta") or {}).get("content") or choice.get("text") or ""
    return "".join(piece(e["choices"][0]) for _, e in events if isinstance(e, dict) and e.get("choices"))
