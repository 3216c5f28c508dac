"""The best path to each peer: its addresses measured, the data link kept on the fastest that answers.

A peer can be reachable at several addresses (discovery lists them all). For each peer with more than
one, every address is probed over a short link of its own ("path" purpose: connect, the same hello as
every link, sealed in a closed swarm, then PINGS frame round trips, the least kept): the address the
choice holds every PROBE_EVERY_S, the others every OTHERS_EVERY_S, one that does not answer less and
less often (up to MAX_EVERY_S). transport/address_choice.py turns the round trips into the choice and
the order to fall back in, which the data lane dials by (`endpoints_of`). When the address its link is
on stops answering, the lane breaks the link at once (`mlx_path_failed`: the entry replays what it
waits for) and the next frame dials the next best; when another address is clearly faster, a link we
dialed moves there once idle (`mlx_path_faster`).

The probes are answered on the peer's event loop, never its MLX thread, so a pass does not time a path.
The frame-hold switch holds a probe's frames to an address like the lane's (transport/frame_hold.py).

Runs on the event loop, except `endpoints_of` (any thread: the lane calls it on the MLX thread).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from discovery.view import PeerInfo

from ..tasks import cancel_and_wait
from ..transport.address_choice import AddressChoice
from ..transport.frame_hold import FrameHold
from ..transport.handshake import dial_stream
from ..transport.link_handshake import LinkAuth
from ..transport.links import PeerLinks
from ..transport.stream_link import StreamFrameLink

log = logging.getLogger(__name__)

PATH_PURPOSE = "path"
PATH_MAX_PAYLOAD = 64  # a probe is one small header, no payload
PINGS = 3
TICK_S = 0.25
PROBE_EVERY_S = 0.75  # the chosen address: a cut path is noticed within about the liveness window
OTHERS_EVERY_S = 3.0
MAX_EVERY_S = 30.0
PROBE_TIMEOUT_S = 1.0  # connect, hello and the pings (generous for a loaded machine)

# What the lane is told (it runs it on the MLX thread): (peer, address, problem) when `address` stopped
# answering, (peer, address, None) when `address` is clearly the fastest and the link is elsewhere.
Tell = Callable[[str, str, str | None], None]


class _Address:
    def __init__(self) -> None:
        self.due = 0.0
        self.every = PROBE_EVERY_S
        self.probing = False


class PathChoice:
    def __init__(self, view: Callable[[], list[PeerInfo]], auth: LinkAuth, links: PeerLinks, tell: Tell,
                 hold: FrameHold | None = None) -> None:
        """`view()`: the peers now (discovery); `tell`: the lane, on the MLX thread (see Tell)."""
        self._view, self.auth, self.links, self._tell, self.hold = view, auth, links, tell, hold
        self._peers: dict[str, tuple[PeerInfo, AddressChoice]] = {}
        self._addresses: dict[tuple[str, str], _Address] = {}
        # peer -> its endpoints, best first: replaced whole on the event loop, read on any thread
        self._endpoints: dict[str, list[tuple[str, int]]] = {}
        self._task: asyncio.Task | None = None
        self._probes: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="path-choice")

    async def stop(self) -> None:
        await cancel_and_wait(self._task, *self._probes)

    # -- any thread --------------------------------------------------------------------------
    def endpoints_of(self, peer: str, fallback: tuple[str, int] | None) -> list[tuple[str, int]]:
        """`peer`'s endpoints, the one to dial first first; `fallback` (discovery's endpoint) alone for a
        peer with one address or none measured yet."""
        if fallback is None:
            return []
        return self._endpoints.get(peer) or [fallback]

    def snapshot(self) -> dict[str, dict]:
        """Per peer with a link or a choice: the address its link is on, the chosen one, round trips (ms)."""
        out: dict[str, dict] = {}
        for peer, conn in ((c.peer, c) for c in self.links.all()):
            out[peer] = {"link": conn.host}
        for peer, (_, choice) in sorted(self._peers.items()):
            entry = out.setdefault(peer, {"link": None})
            entry["chosen"] = choice.chosen
            entry["rtt_ms"] = {a: round(rtt * 1e3, 3) for a in choice.addresses if (rtt := choice.rtt(a)) is not None}
        return out

    # -- event loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self._tick(asyncio.get_running_loop().time())
            except Exception:
                log.exception("choosing paths")

    def _tick(self, now: float) -> None:
        seen = {p.node_id: p for p in self._view() if len(p.addresses) > 1}
        for gone in set(self._peers) - set(seen):
            del self._peers[gone]
            self._endpoints.pop(gone, None)
        for key in [k for k in self._addresses if k[0] not in seen or k[1] not in seen[k[0]].addresses]:
            del self._addresses[key]
        for peer, info in seen.items():
            known = self._peers.get(peer)
            if known is None:
                choice = AddressChoice(info.addresses)
            else:
                choice = known[1]
                if choice.addresses != info.addresses:
                    choice.update(info.addresses)
            self._peers[peer] = (info, choice)
            self._publish(peer)
            for address in info.addresses:
                state = self._addresses.setdefault((peer, address), _Address())
                if not state.probing and now >= state.due:
                    state.probing = True
                    task = asyncio.create_task(self._probe(peer, address, info.profile.peer_port, state),
                                               name=f"path {peer} {address}")
                    self._probes.add(task)
                    task.add_done_callback(self._probes.discard)

    def _publish(self, peer: str) -> None:
        info, choice = self._peers[peer]
        self._endpoints[peer] = [(a, info.profile.peer_port) for a in choice.order()]

    async def _probe(self, peer: str, address: str, port: int, state: _Address) -> None:
        loop = asyncio.get_running_loop()
        try:
            rtt = await self._round_trip(peer, address, port)
        finally:
            state.probing = False
        known = self._peers.get(peer)
        if known is None or address not in known[1].addresses:
            return  # gone meanwhile
        choice = known[1]
        was_working = choice.working(address)
        moved = choice.measured(address, rtt) if rtt is not None else choice.failed(address)
        if rtt is None:
            state.every = min(MAX_EVERY_S, state.every * 2) if not choice.working(address) else PROBE_EVERY_S
        else:
            state.every = PROBE_EVERY_S if address == choice.chosen else OTHERS_EVERY_S
        state.due = loop.time() + state.every
        if moved:
            log.info("the path to %s is now %s (%s)", peer, choice.chosen,
                     ", ".join(f"{a} {r * 1e3:.1f} ms" if (r := choice.rtt(a)) is not None else f"{a} ?"
                               for a in choice.addresses))
            self._addresses[(peer, choice.chosen)].every = PROBE_EVERY_S
        self._publish(peer)
        if was_working and not choice.working(address):
            self._tell(peer, address, f"its address {address} stopped answering")
        elif choice.working(choice.chosen) and choice.rtt(choice.chosen) is not None:
            conn = self.links.link(peer)
            if conn is not None and conn.host != choice.chosen and conn.host in choice.addresses:
                self._tell(peer, choice.chosen, None)

    async def _round_trip(self, peer: str, address: str, port: int) -> float | None:
        """The least of PINGS round trips over a new link to `peer` at `address`; None: no answer in time."""
        loop = asyncio.get_running_loop()
        delay = self.hold.delay_to_address(address) if self.hold is not None else 0.0
        least = None
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S + PINGS * delay):
                link = await dial_stream((address, port), self.auth, PATH_PURPOSE, expected_peer=peer,
                                         max_payload=PATH_MAX_PAYLOAD, timeout=PROBE_TIMEOUT_S)
                try:
                    for n in range(PINGS):
                        sent = loop.time()
                        if delay:
                            await asyncio.sleep(delay)  # the frame is held like the lane's to this address
                        await link.send({"t": "path", "n": n})
                        frame = await link.receive()
                        if frame.header.get("t") != "path" or frame.header.get("n") != n:
                            return None
                        took = loop.time() - sent
                        least = took if least is None else min(least, took)
                finally:
                    await link.close()
        except Exception:  # noqa: BLE001 (refused, closed, garbled or late: no answer)
            return None
        return least


def serve_paths(hold: FrameHold | None):
    """The listener's handler for "path" links: each probe frame answered at once (held like the lane's
    frames to its address), PINGS at most per link."""
    async def handler(link: StreamFrameLink) -> None:
        address = link.remote_host
        delay = hold.delay_for(link.peer, address) if hold is not None else 0.0
        for _ in range(PINGS):
            frame = await link.receive()
            n = frame.header.get("n")
            if frame.header.get("t") != "path" or not isinstance(n, int):
                return
            if delay:
                await asyncio.sleep(delay)
            await link.send({"t": "path", "n": n})
    return handler
