"""Keep a live topology from some node: SSE first, polling as fallback, failover on death.

The watcher calls back into the app; it never touches widgets itself:
  on_snapshot(raw_topology: dict)        every fresh snapshot
  on_event(type: str, data: dict)        join/leave/plan/request_* (from SSE, or diffed when polling)
  on_status(connected: bool, url: str, mode: str, message: str | None)
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from .client import NodeClient, NodeError
from .topology import Topology

POLL_INTERVAL = 1.0      # seconds between GET /v1/topology when the stream is unavailable
SSE_RETRY_POLLS = 10     # polls before trying the event stream again
PROBE_EVERY = 3.0        # also GET /v1/topology this often while streaming: a node shutting down
                         # (or a dead link) can leave the stream open, but refuses new requests


def diff_events(old: Topology | None, new: Topology) -> list[tuple[str, dict]]:
    """Events equivalent to what the SSE stream would have said, from two snapshots."""
    if old is None:
        return []
    out: list[tuple[str, dict]] = []
    for nid in new.nodes.keys() - old.nodes.keys():
        out.append(("join", {"node_id": nid, "name": new.nodes[nid].name}))
    for nid in old.nodes.keys() - new.nodes.keys():
        out.append(("leave", {"node_id": nid, "name": old.nodes[nid].name}))
    if (old.plan.id if old.plan else None) != (new.plan.id if new.plan else None):
        out.append(("plan", {"plan": {"id": new.plan.id if new.plan else None}}))
    return out


class Watcher:
    def __init__(self, client: NodeClient, urls: list[str], on_snapshot: Callable, on_event: Callable,
                 on_status: Callable):
        self.client = client
        self.seed_urls = [u.rstrip("/") for u in urls]
        self.url = self.seed_urls[0]
        self.on_snapshot, self.on_event, self.on_status = on_snapshot, on_event, on_status
        self.last: Topology | None = None
        self._last_seen = 0.0
        self._ever_connected = False

    def candidates(self) -> list[str]:
        """Every known node URL, the current one last (it just failed)."""
        known = self.seed_urls + (self.last.urls() if self.last else [])
        seen, out = set(), []
        for u in known:
            if u not in seen and u != self.url:
                seen.add(u)
                out.append(u)
        return out + [self.url]

    def _snapshot(self, raw: dict) -> Topology:
        self._last_seen = time.monotonic()
        topo = Topology.parse(raw)
        self.last = topo
        self.on_snapshot(raw)
        return topo

    async def refresh(self) -> None:
        """One immediate GET (the `r` key); errors are left to the watch loop."""
        try:
            self._snapshot(await self.client.topology(self.url))
        except NodeError:
            pass

    async def run(self) -> None:
        while True:
            if not await self._connect():
                await asyncio.sleep(POLL_INTERVAL)
                continue
            reason = await self._watch_live()
            if reason is None:     # stream unavailable but the node answers: poll
                reason = await self._poll()
            if reason is not None:
                self.on_status(False, self.url, "disconnected", f"lost {self.url}: {reason}")

    async def _connect(self) -> bool:
        """Find a node that answers, preferring a different one from the one that failed."""
        urls = [self.url] if not self._ever_connected else self.candidates()
        for url in urls:
            try:
                raw = await self.client.topology(url)
            except NodeError as e:
                if not self._ever_connected:
                    self.on_status(False, url, "disconnected", f"cannot reach {url}: {e}")
                continue
            switched = self._ever_connected and url != self.url
            self.url, self._ever_connected = url, True
            self.on_status(True, url, "connected",
                           f"reconnected to {url}" if switched else f"connected to {url}")
            self._snapshot(raw)
            return True
        return False

    async def _watch_live(self) -> str | None:
        """Follow the SSE stream. Returns why the node is gone, or None if it is alive but
        the stream is unusable (then the caller polls)."""
        stream = asyncio.ensure_future(self._stream())
        watchdog = asyncio.ensure_future(self._watchdog())
        try:
            done, _ = await asyncio.wait({stream, watchdog}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (stream, watchdog):
                t.cancel()
            await asyncio.gather(stream, watchdog, return_exceptions=True)
        if watchdog in done and isinstance(watchdog.exception(), NodeError):
            return str(watchdog.exception())
        # The stream ended or failed: is the node still there?
        try:
            self._snapshot(await self.client.topology(self.url))
        except NodeError as e:
            return str(e)
        err = stream.exception() if stream in done and not stream.cancelled() else None
        self.on_status(True, self.url, "polling", f"event stream unavailable ({err or 'closed'}); polling")
        return None

    async def _stream(self) -> None:
        live = False
        async for event, data in self.client.events(self.url):
            if not live:
                live = True
                self.on_status(True, self.url, "live", None)
            if event == "snapshot" and isinstance(data, dict):
                self._snapshot(data)
            else:
                self._last_seen = time.monotonic()
                self.on_event(event, data if isinstance(data, dict) else {"data": data})

    async def _watchdog(self) -> None:
        """Raises NodeError when the node stops answering plain GETs, stream or no stream."""
        while True:
            await asyncio.sleep(PROBE_EVERY)
            raw = await self.client.topology(self.url)
            if time.monotonic() - self._last_seen > PROBE_EVERY:   # the stream went quiet: use this
                self._snapshot(raw)

    async def _poll(self) -> str | None:
        """Poll for a while; returns why the node is gone, or None to retry the stream."""
        for _ in range(SSE_RETRY_POLLS):
            await asyncio.sleep(POLL_INTERVAL)
            old = self.last
            try:
                topo = self._snapshot(await self.client.topology(self.url))
            except NodeError as e:
                return str(e)
            for event, data in diff_events(old, topo):
                self.on_event(event, data)
        return None
