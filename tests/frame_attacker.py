"""Test support: a hostile peer that speaks the peer protocol to real nodes, and the victim it attacks.

    stranger = await start_stranger(swarm, port)        # answers profile requests: nodes given
                                                         # `--peer 127.0.0.1:port` admit it to their view
    stranger.addresses[node_id] = ("127.0.0.1", peer_port)
    await stranger.send_all(node_id, [Token(...), ...])  # says hello as itself, then sends typed messages
    victim = Victim(entry_url, body).start()             # a greedy stream the attack runs beside
    rid = victim.request_id()

The stranger is a tests/peer_nodes.PeerNode (a real listener, links and data lane on an MLX
worker thread): every frame it sends is a well-formed message of the real protocol, so what a
node refuses it refuses for who sent it or what it says, not for how it is framed.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path

from peer_nodes import HOST, PeerNode

from discovery.node_id import new_instance_nonce
from discovery.profile import NodeProfile
from swarm.transport.errors import PeerUnreachable
from swarm.transport.messages import Message

STRANGER_FINGERPRINT = "stranger"  # never the model's: the stranger is in the view, never in a plan


def stranger_profile(node_id: str, swarm: str, port: int) -> NodeProfile:
    return NodeProfile(node_id=node_id, name=node_id, swarm=swarm, api_port=1, peer_port=port, speed=0.002,
                       model_id="stranger", model_fingerprint=STRANGER_FINGERPRINT, memory_total=2**30,
                       memory_available=2**30, instance=new_instance_nonce(), started_at=time.time())


class Stranger(PeerNode):
    async def send_all(self, node_id: str, messages: list[Message]) -> None:
        """Send them in order on the MLX thread, in one hand-off (fast enough to sweep). A link the node
        cut meanwhile is dialled again and they are all sent once more: on a loaded machine the stranger's
        own liveness probes can fail, and the node then drops its connection (as it should: a peer that
        left); every attack here means the same sent twice."""
        def send() -> None:
            for message in messages:
                self.lane.mlx_send(node_id, message)
        try:
            await self.worker.run(send)
        except PeerUnreachable:
            await self.worker.run(send)

    def answers(self) -> list:
        """Every message nodes sent the stranger so far (sender, message)."""
        got = []
        while not self.inbox.empty():
            got.append(self.inbox.get_nowait())
        return got


async def start_stranger(swarm: str, port: int, node_id: str = "stranger-1") -> Stranger:
    return await Stranger(node_id, {}, swarm=swarm, port=port, profile=stranger_profile(node_id, swarm, port)).start()


class Victim:
    """An honest greedy chat stream, run in a thread; its request id is found as an attacker would
    (the events stream, where it was published) or, once that is fixed, in the entry's debug log."""

    def __init__(self, url: str, messages: list[dict], max_tokens: int, log: Path):
        self.url, self.messages, self.max_tokens, self.log = url, messages, max_tokens, log
        self.text, self.finish_reason, self.error, self.chunks = "", None, None, 0
        self.started_event: dict | None = None
        self._started = threading.Event()
        self._done = threading.Event()

    def start(self) -> "Victim":
        self._log_start = self.log.stat().st_size
        threading.Thread(target=self._watch_events, daemon=True).start()
        self._started.wait(10)  # subscribed (or refused: then the log tells)
        threading.Thread(target=self._run, daemon=True).start()
        return self

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float = 120) -> "Victim":
        assert self._done.wait(timeout), "the victim's stream did not end"
        return self

    def _watch_events(self) -> None:
        try:
            with urllib.request.urlopen(self.url + "/v1/topology/events", timeout=60) as r:
                self._started.set()
                kind = None
                for line in r:
                    if line.startswith(b"event: "):
                        kind = line[7:].strip().decode()
                    elif line.startswith(b"data: ") and kind == "request_started":
                        self.started_event = json.loads(line[6:])
                        return
        except OSError:
            self._started.set()

    def _run(self) -> None:
        body = {"messages": self.messages, "max_tokens": self.max_tokens, "temperature": 0, "stream": True}
        req = urllib.request.Request(self.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                for line in r:
                    if not line.startswith(b"data: ") or line[6:].strip() == b"[DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.error = event["error"]
                        continue
                    choice = event["choices"][0] if event.get("choices") else {}
                    self.text += (choice.get("delta") or {}).get("content") or ""
                    self.chunks += 1
                    self.finish_reason = choice.get("finish_reason") or self.finish_reason
        except OSError as e:
            self.error = {"message": f"connection: {e}"}
        finally:
            self._done.set()

    def request_id(self, timeout: float = 30) -> str:
        """The victim's request id: from the published event, else from the entry's debug log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            event = self.started_event
            if event and event.get("request_id"):
                return event["request_id"]
            with open(self.log, errors="replace") as f:
                f.seek(self._log_start)
                found = re.findall(r"request ([0-9a-f]{32}) started", f.read())
            if found:
                return found[-1]
            time.sleep(0.01)
        raise AssertionError("the victim's request id was found neither in the events nor in the log")

    def replays(self, rid: str) -> list[str]:
        """The entry's log lines saying this request's pipeline broke (and was replayed)."""
        return [line for line in self.log.read_text(errors="replace").splitlines()
                if rid in line and "pipeline broke" in line]


__all__ = ["HOST", "Stranger", "Victim", "start_stranger", "stranger_profile"]
