"""A node polls its peers' /health for the topology's live stats only while someone reads the topology."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from swarm.status import peer_stats
from swarm.status.peer_stats import PeerStats


async def test_peers_are_polled_only_while_the_topology_is_read(monkeypatch):
    monkeypatch.setattr(peer_stats, "WATCHED_S", 0.3)
    peers = [SimpleNamespace(node_id=f"p{i}", addresses=["10.0.0.1"], profile=SimpleNamespace(api_port=1))
             for i in range(3)]
    stats = PeerStats(SimpleNamespace(view=lambda: peers), interval=0.02)
    polled = []

    async def poll(session, peer):
        polled.append(peer.node_id)
        return {"total_requests": 1}

    monkeypatch.setattr(stats, "_poll", poll)
    stats.start()
    try:
        await asyncio.sleep(0.2)
        assert polled == [] and stats.get("p0") is None  # nobody reads the topology: no request at all
        stats.watched()
        await asyncio.sleep(0.1)
        assert len(polled) >= 3 and stats.get("p0") == {"total_requests": 1}
        await asyncio.sleep(0.4)  # unread for longer than WATCHED_S: the polls stop, the old counters go
        count = len(polled)
        assert stats.get("p0") is None
        await asyncio.sleep(0.2)
        assert len(polled) == count
        stats.watched()
        await asyncio.sleep(0.1)
        assert len(polled) > count
    finally:
        await stats.stop()
