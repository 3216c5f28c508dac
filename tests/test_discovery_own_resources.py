"""A node out of descriptors declares nobody gone (issue 33).

Two discoveries with static peers on loopback, in this process. Then this process runs out of
descriptors (its soft limit lowered to what it holds, every free number below taken) for longer
than liveness needs to declare a peer gone (3 probes): each probe fails at socket() with EMFILE,
which says nothing of the peer. Before, that was a leave of every peer (an HTTP slowloris that
took a node's descriptors split the swarm); now the peers stay, and probes count again once
descriptors are back.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time

from discovery import NodeProfile, PeerEvent
from discovery.liveness import PROBE_FAILURES, PROBE_INTERVAL
from helpers import eventually, free_ports, start_static_discovery


def profile(node_id: str, port: int) -> NodeProfile:
    return NodeProfile(node_id=node_id, name=node_id, swarm="default", api_port=8000, peer_port=port,
                       backend="cpu", memory_total=1 << 30, memory_available=1 << 30, speed=0.01,
                       model_id="m", model_fingerprint="fp", instance=f"inst-{node_id}", started_at=time.time())


class OutOfDescriptors:
    """This process cannot open another descriptor while inside (the limit is restored after)."""

    def __enter__(self) -> "OutOfDescriptors":
        self.limits = resource.getrlimit(resource.RLIMIT_NOFILE)
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, self.limits[1]))
        self.fillers = []
        try:
            while True:
                self.fillers.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        return self

    def __exit__(self, *exc) -> None:
        for fd in self.fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, self.limits)


async def test_probes_that_fail_for_want_of_our_own_descriptors_declare_nobody_gone():
    port_a, port_b = free_ports(2)
    events: asyncio.Queue[PeerEvent] = asyncio.Queue()
    a, server_a = await start_static_discovery(profile("a", port_a), [port_b], events)
    b, server_b = await start_static_discovery(profile("b", port_b), [port_a])
    try:
        await eventually(lambda: any(p.node_id == "b" for p in a.view()), 10, "a sees b")
        while not events.empty():
            events.get_nowait()
        starved_s = PROBE_FAILURES * PROBE_INTERVAL * 3
        with OutOfDescriptors():
            await asyncio.sleep(starved_s)
        await asyncio.sleep(PROBE_INTERVAL * 2)  # probes answer again
        seen = []
        while not events.empty():
            seen.append(events.get_nowait())
        assert [(e.kind, e.node_id) for e in seen if e.kind == "leave"] == [], seen
        assert [p.node_id for p in a.view()] == ["b"]
    finally:
        for d in (a, b):
            await d.stop()
        for server in (server_a, server_b):
            server.close()
            await server.wait_closed()
