"""Peer events that arrive together are planned for once (node.py's consumer of discovery's events): a
swarm of 32 sends profile updates by the dozen a second, and a plan per event kept every node planning."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from discovery import PeerEvent

from swarm.node.node import _consume_peer_events


async def test_a_burst_of_peer_events_is_planned_for_once():
    handled, settled, dropped = [], [], []

    class Coordinator:
        async def on_peer_event(self, event, replan=True):
            handled.append((event.node_id, replan))

        async def settle(self):
            settled.append(len(handled))

    events: asyncio.Queue = asyncio.Queue()
    for i in range(5):
        events.put_nowait(PeerEvent("update", f"p{i}", None))
    events.put_nowait(PeerEvent("leave", "p9", None))
    task = asyncio.create_task(_consume_peer_events(events, SimpleNamespace(drop_peer=dropped.append), Coordinator()))
    try:
        await asyncio.sleep(0.05)
        assert handled == [(f"p{i}", False) for i in range(5)] + [("p9", False)] and dropped == ["p9"]
        assert settled == [6]  # one plan, after the last of the burst
        events.put_nowait(PeerEvent("update", "p1", None))
        await asyncio.sleep(0.05)
        assert settled == [6, 7]
    finally:
        task.cancel()
