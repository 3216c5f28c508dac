"""Round trips a busy MLX thread cannot inflate (node/link_meter.py), over a real lane on loopback.

A ping that waits behind a pass, at the peer (read only after its pass) or at the pinger (its Pong read
only after the pinger's own pass), would time the pass, not the link: such a round trip is no sample.
Here every ping meets a pass of PASS_S, at one end, while the link takes well under a millisecond; once
the passes end, the link is measured again as it is."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from peer_nodes import PeerNode

from swarm.node import link_meter
from swarm.node.link_meter import LinkMeter, answer_ping
from swarm.transport.ping_messages import Ping, Pong

pytestmark = pytest.mark.timeout(180)
PASS_S = 0.25
PONGS = 6  # pongs that came back behind passes, before the passes end
WAIT_S = 60.0  # for what a loaded machine does in a few seconds


class PassesWithPings:
    """The pinger's worker, as the meter sees it: while `busy`, every ping it posts meets a pass of PASS_S,
    on the pinger's own thread right after the ping is sent, or on the peer's as the ping arrives."""

    def __init__(self, pinger: PeerNode, peer: PeerNode, side: str) -> None:
        self.worker, self.peer, self.side = pinger.worker, peer, side
        self.busy = True

    def post(self, fn, *args) -> None:
        if not self.busy:
            self.worker.post(fn, *args)
        elif self.side == "pinger":
            self.worker.post(fn, *args)
            self.worker.post(time.sleep, PASS_S)  # the same round: the Pong comes back during the pass
        else:
            self.peer.worker.post(time.sleep, PASS_S)
            self.worker.post(time.sleep, 0.02)  # (the peer's pass is under way when the ping arrives)
            self.worker.post(fn, *args)

    def __getattr__(self, name: str):
        return getattr(self.worker, name)


async def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("side", ["pinger", "peer"])
async def test_a_ping_behind_a_pass_is_no_sample_and_an_idle_link_is_measured(side, monkeypatch) -> None:
    monkeypatch.setattr(link_meter, "TICK_S", 0.05)
    monkeypatch.setattr(link_meter, "PING_EVERY_S", 0.4)
    addresses: dict = {}
    meter: list[LinkMeter] = []
    pongs = [0]
    lock = threading.Lock()

    def pinger_inbox(sender: str, message) -> None:
        if isinstance(message, Pong):
            with lock:
                pongs[0] += 1
            meter[0].mlx_pong(sender, message)

    def peer_inbox(sender: str, message) -> None:
        if isinstance(message, Ping):
            answer_ping(b.lane, b.worker, sender, message)

    a = await PeerNode("node-a", addresses, on_message=pinger_inbox).start()
    b = await PeerNode("node-b", addresses, on_message=peer_inbox).start()
    worker = PassesWithPings(a, b, side)

    async def publish(links: dict) -> None:
        pass

    meter.append(LinkMeter("node-a", a.lane, worker, asyncio.get_running_loop(), lambda: ["node-b"], publish))
    await meter[0].start()
    try:
        await wait_for(lambda: pongs[0] >= PONGS, f"{PONGS} pongs")
        least = meter[0].snapshot()["node-b"]["rtt_least"]
        assert least is None or least < PASS_S / 2, f"a round trip of {least:.3f} s counted a pass of {PASS_S} s"

        worker.busy = False
        await wait_for(lambda: meter[0].snapshot()["node-b"]["rtt_least"] is not None, "round trip measured")
        least = meter[0].snapshot()["node-b"]["rtt_least"]
        assert least < PASS_S / 2
    finally:
        await meter[0].stop()
        for node in (a, b):
            await node.stop()
