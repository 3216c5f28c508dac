"""Measure this node's links to its peers over the data lane, and advertise them with its profile.

Every peer in the view that serves our model and could be planned (its layers proved, where they are
checked) could be handed our activations, so each is pinged
(transport/ping_messages.py) on the data link the lane holds to it (the one activations take: sealed in
a closed swarm, and held by the frame-hold switch like any frame), about every PING_EVERY_S, or less often
with more peers than PINGS_PER_S * PING_EVERY_S: a node sends at most about PINGS_PER_S pings a second
whatever the swarm's size (every node pinging every peer costs the machines of a large swarm a share
of their cores that grows with it, and a link changes slowly); pings 4-6
and every BW_EVERY-th carry PAD_BYTES of padding, which gives the link's bandwidth (a bounded probe:
link_estimate.py). A peer that does not answer within PONG_TIMEOUT_S is asked less and less often
(up to MAX_EVERY_S apart). What link_estimate.py makes of the samples is published in the profile's
`links` when it changes, at most once in PUBLISH_GAP_S (discovery/link_costs.py): each publication
changes every peer's view, and every node plans again for it, so the first estimates of a swarm's
links, which come in one by one, are published a few at a time.

The ping is sent and its Pong read on the MLX thread, which also runs the passes, and so does the
peer's: a ping or a Pong that arrives during a pass is read after it, and its round trip times the
pass. So a round trip is a sample only when neither end can have kept it waiting behind work
(engine/busy_spans.py): this thread worked at most SLIGHT_S between sending the ping and reading its
Pong, and the peer says it had worked at most that much for at least the whole round trip before it
read the ping (Pong.quiet_us). Other answers keep the peer asked as often, and are no sample: while
passes fill either end's time the estimate keeps what the last honest samples said.
The frame-hold switch's delay is the link's: a held frame leaves on time unless work kept it.

The sampling runs on the event loop, like everything else here except the `mlx_` methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from typing import Awaitable, Callable

from ..engine.busy_spans import SLIGHT_S
from ..engine.worker import MlxWorker
from ..tasks import cancel_and_wait
from ..transport.errors import PeerUnreachable
from ..transport.lane import DataLane
from ..transport.ping_messages import Ping, Pong
from .link_estimate import LinkEstimate, advertised

log = logging.getLogger(__name__)

TICK_S = 0.5
PING_EVERY_S = 2.0
PINGS_PER_S = 4.0
PUBLISH_GAP_S = 10.0
MAX_EVERY_S = 30.0
PONG_TIMEOUT_S = 10.0
PAD_BYTES = 256 * 1024
FIRST_PADDED = (4, 5, 6)  # the first padded pings (they need round trips to compare with)
BW_EVERY = 10  # then every 10th (about every 20 s)
MAX_IN_FLIGHT = 4096


class _Peer:
    def __init__(self, due: float, every: float) -> None:
        self.due = due
        self.every = every
        self.sent = 0
        self.waiting: dict[int, float] = {}  # nonce -> when sent (event loop clock), unanswered
        self.estimate = LinkEstimate()


class LinkMeter:
    def __init__(self, own_id: str, lane: DataLane, worker: MlxWorker, loop: asyncio.AbstractEventLoop,
                 peers: Callable[[], list[str]], publish: Callable[[dict], Awaitable[None]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`peers()`: the node ids to measure now; `publish(links)`: advertise them (event loop)."""
        self.own_id, self.lane, self.worker, self.loop = own_id, lane, worker, loop
        self._peers_now, self._publish, self.clock = peers, publish, clock
        self._peers: dict[str, _Peer] = {}  # event loop only
        # MLX thread only: nonce -> (peer, sent at, this thread's work clock then, padding, whether its
        # link was being opened)
        self._sent: dict[int, tuple[str, float, float, int, bool]] = {}
        self.published: dict[str, tuple[float, float]] = {}
        self._published_at: float | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="link-meter")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def snapshot(self) -> dict[str, dict]:
        """What is measured of each peer now (for status and tests)."""
        return {peer: {"rtt_least": p.estimate.least_rtt(), "rtt": p.estimate.rtt, "bw": p.estimate.bw,
                       "every_s": p.every} for peer, p in sorted(self._peers.items())}

    # -- event loop ------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self._tick()
            except Exception:
                log.exception("measuring links")

    async def _tick(self) -> None:
        now = self.clock()
        current = set(self._peers_now()) - {self.own_id}
        for gone in set(self._peers) - current:
            del self._peers[gone]
        pace = self._pace(len(current))
        for peer in sorted(current):
            state = self._peers.setdefault(peer, _Peer(now + random.random() * pace, pace))
            for nonce, sent in list(state.waiting.items()):
                if now - sent > PONG_TIMEOUT_S:  # no answer: ask less often
                    del state.waiting[nonce]
                    state.every = min(max(MAX_EVERY_S, pace), state.every * 2)
            if now >= state.due:
                state.sent += 1
                padded = state.sent in FIRST_PADDED or state.sent % BW_EVERY == 0
                nonce = secrets.randbits(63)
                state.waiting[nonce] = now
                state.due = now + max(state.every, pace) * (0.75 + 0.5 * random.random())
                self.worker.post(self._mlx_ping, peer, nonce, PAD_BYTES if padded else 0)
            state.estimate.check(now)
        links = advertised({peer: p.estimate for peer, p in self._peers.items()}, self.own_id)
        if links != self.published and (self._published_at is None or now - self._published_at >= PUBLISH_GAP_S):
            self.published, self._published_at = links, now
            await self._publish(links)

    def _pace(self, n_peers: int) -> float:
        """Seconds between two pings to one peer: PING_EVERY_S, or what keeps this node at PINGS_PER_S."""
        return max(PING_EVERY_S, n_peers / PINGS_PER_S)

    def _sampled(self, peer: str, nonce: int, seconds: float | None, pad: int) -> None:
        state = self._peers.get(peer)
        if state is None or state.waiting.pop(nonce, None) is None:
            return  # a peer gone from the view, or an answer after we gave up on it
        state.every = self._pace(len(self._peers))
        if seconds is None:
            return  # it answered, but its round trip counted a dial, or may have waited behind work
        if pad:
            state.estimate.padded_sample(self.clock(), seconds, pad)
        else:
            state.estimate.rtt_sample(self.clock(), seconds)

    # -- MLX thread ------------------------------------------------------------------------
    def _mlx_ping(self, peer: str, nonce: int, pad: int) -> None:
        if len(self._sent) >= MAX_IN_FLIGHT:  # answers that never came: forget the oldest half
            for old in list(self._sent)[:MAX_IN_FLIGHT // 2]:
                del self._sent[old]
        try:
            self.lane.mlx_send(peer, Ping(nonce, pad))
        except PeerUnreachable:
            return  # the lane logged it; the ping goes unanswered and the peer is asked less often
        # While its link is being opened the round trip counts the dial: an answer, not a sample.
        self._sent[nonce] = (peer, time.monotonic(), self.worker.mlx_worked(), pad,
                             self.lane.mlx_opening(peer) is not None)

    def mlx_pong(self, sender: str, pong: Pong) -> None:
        """A Pong from `sender` (the node's inbox, MLX thread)."""
        sent = self._sent.pop(pong.nonce, None)
        if sent is None or sent[0] != sender:  # (a nonce is only good from the node it went to)
            return
        peer, at, worked, pad, dialing = sent
        seconds = time.monotonic() - at
        if dialing or not honest(seconds, self.worker.mlx_worked() - worked, pong.quiet_s()):
            seconds = None
        self.loop.call_soon_threadsafe(self._sampled, peer, pong.nonce, seconds, pad)


def honest(seconds: float, worked_s: float, peer_quiet_s: float | None) -> bool:
    """Whether a round trip of `seconds` timed its link only: this thread worked `worked_s` meanwhile,
    and the peer had worked next to nothing for `peer_quiet_s` before it read the ping (None: it does
    not say)."""
    return worked_s <= SLIGHT_S and peer_quiet_s is not None and peer_quiet_s >= seconds


def answer_ping(lane: DataLane, worker: MlxWorker, sender: str, ping: Ping) -> None:
    """A peer's Ping: answered at once, saying how long it may have waited here (MLX thread)."""
    with contextlib.suppress(PeerUnreachable):  # it asked and went: nobody waits for the answer
        lane.mlx_send(sender, Pong.answering(ping.nonce, worker.mlx_quiet()))
