"""Live request stats of the other nodes, polled from their /health for the topology view.

These counters stay in /health for callers without the API key (node_status.py): the poll
sends no key, since a peer's address may be a stranger's (in a swarm without a secret, anyone
can put one in the view) and a key sent there would be the stranger's to use.

They are polled only while someone reads the topology (WATCHED_S after its last reading): every node
polling every peer each second is a request per peer per second per node, which nobody needs when no
one looks (at 32 nodes, a thousand HTTP requests a second among them).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from ..tasks import cancel_and_wait

log = logging.getLogger(__name__)

WATCHED_S = 10.0
STAT_KEYS = ("active_requests", "prefilling", "tokens_per_second", "total_requests", "total_tokens", "prompt_cache")  # open in /health


class PeerStats:
    def __init__(self, discovery, interval: float = 1.0):
        self.discovery, self.interval = discovery, interval
        self._stats: dict[str, dict] = {}
        self._task: asyncio.Task | None = None
        self._asked_at: float | None = None  # the topology's last reading (loop time)
        self._asked = asyncio.Event()

    def watched(self) -> None:
        """The topology is being read: poll for the next WATCHED_S (at once, if the polls had stopped)."""
        self._asked_at = asyncio.get_running_loop().time()
        self._asked.set()

    def get(self, node_id: str) -> dict | None:
        return self._stats.get(node_id)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="peer-stats")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _loop(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.interval)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            loop = asyncio.get_running_loop()
            while True:
                if self._asked_at is None or loop.time() - self._asked_at > WATCHED_S:
                    self._stats = {}  # (old counters would show as now's when the next reader comes)
                    self._asked.clear()
                    await self._asked.wait()
                peers = self.discovery.view()
                results = await asyncio.gather(*(self._poll(session, p) for p in peers))
                self._stats = {p.node_id: r for p, r in zip(peers, results) if r is not None}
                await asyncio.sleep(self.interval)

    async def _poll(self, session: aiohttp.ClientSession, peer) -> dict | None:
        url = f"http://{_host(peer.addresses[0])}:{peer.profile.api_port}/health"
        try:
            async with session.get(url) as r:
                body = await r.json()
            return {k: body[k] for k in STAT_KEYS if k in body}
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError):
            return None


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
