"""Probes over the data lane: does a peer read what we send it, and soon? (transport/probe_messages.py)

`probe(node, timeout)` (event loop) sends a Probe on the MLX thread, behind whatever waits for that
peer on its link, and waits for its Probed. A peer that does not answer in time takes no data: the
link is broken (what waits on it may never be read: requests on it replay) and planning leaves the
peer out (planning/slow_members.py). The node's inbox hands over each Probed (`mlx_answered`) and
answers the probes of others itself.

`timeout` allows for the longest pass the peer may be computing (it reads between passes only).
When no answer came within PROBE_TIMEOUT_S, the peer is asked for its MLX thread's longest recent
round of work (node/mlx_rounds.py): if it turned its rounds over quickly all along and still has not
read the probe, nothing it computes holds the probe back, and it gets TURNOVER_GRACE_S more, not the
whole allowance. No answer, or a long round: the whole allowance.

A probe whose link broke while it waited (its path stopped answering: node/path_choice.py) goes once
more, on the peer's next link: a path that broke says nothing of whether the peer reads its lane.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Awaitable, Callable

from ..engine.worker import MlxWorker
from ..planning.slow_members import PROBE_TIMEOUT_S
from ..transport.errors import PeerUnreachable
from ..transport.lane import DataLane
from ..transport.probe_messages import Probe

ASK_TIMEOUT_S = 1.0  # the peer's event loop answers at once, unless it is swamped (then: the whole allowance)
LONG_ROUND_S = 0.5  # rounds of its MLX thread this long may be passes that hold our probe back
TURNOVER_GRACE_S = 1.0  # a peer that turns its rounds over quickly reads our probe at its next one

AskRound = Callable[[str, float], Awaitable[float | None]]  # (node, timeout): its longest recent round, or None


class LaneProbe:
    def __init__(self, lane: DataLane, worker: MlxWorker, loop: asyncio.AbstractEventLoop,
                 ask_round: AskRound | None = None):
        """`ask_round`: a peer's MLX thread's longest recent round of work (None: never asked)."""
        self.lane, self.worker, self.loop, self.ask_round = lane, worker, loop, ask_round
        self._waiting: dict[int, tuple[str, asyncio.Future]] = {}  # nonce -> (node, its answer)
        self._resent: set[int] = set()  # probes sent again once their link broke (event loop)

    async def probe(self, node: str, timeout: float) -> bool:
        """True if `node` answered within `timeout` s (less if it computes nothing meanwhile); else its link is broken."""
        nonce = secrets.randbits(63)
        answered = self.loop.create_future()
        self._waiting[nonce] = (node, answered)
        start = self.loop.time()
        try:
            async with asyncio.timeout(min(timeout, PROBE_TIMEOUT_S)):
                opening = await self.worker.run(self._mlx_send, node, Probe(nonce))
                if opening is not None:  # its link is being opened: a dial that fails is a peer unreachable
                    await asyncio.wrap_future(opening)
            if await _within(answered, min(timeout, PROBE_TIMEOUT_S) - (self.loop.time() - start)):
                return True
            why = f"it did not answer a probe within {timeout:.0f} s"
            if timeout > PROBE_TIMEOUT_S and self.ask_round is not None:
                busy = await self.ask_round(node, ASK_TIMEOUT_S)
                if busy is not None and busy < LONG_ROUND_S:
                    timeout = min(timeout, self.loop.time() - start + TURNOVER_GRACE_S)
                    why = (f"it did not answer a probe within {timeout:.0f} s, and its MLX thread is "
                           f"computing nothing that holds it back")
            if await _within(answered, timeout - (self.loop.time() - start)):
                return True
        except PeerUnreachable:
            return False
        except TimeoutError:
            why = f"it did not take a probe within {min(timeout, PROBE_TIMEOUT_S):.0f} s"
        finally:
            self._waiting.pop(nonce, None)
            self._resent.discard(nonce)
        await self.worker.run(self.lane.mlx_break, node, why)
        return False

    def _mlx_send(self, node: str, probe: Probe):
        self.lane.mlx_send(node, probe)
        return self.lane.mlx_opening(node)

    def mlx_link_broken(self, node: str) -> None:
        """The link to `node` broke (MLX thread): the probes that wait for it go again, once each."""
        self.loop.call_soon_threadsafe(self._resend, node)

    def _resend(self, node: str) -> None:
        nonces = [n for n, (peer, answered) in self._waiting.items()
                  if peer == node and not answered.done() and n not in self._resent]
        if nonces:
            self._resent.update(nonces)
            self.worker.post(self._mlx_resend, node, nonces)

    def _mlx_resend(self, node: str, nonces: list[int]) -> None:
        for nonce in nonces:
            try:
                self.lane.mlx_send(node, Probe(nonce))
            except PeerUnreachable:
                return  # the lane said why; the probe runs out its time

    def mlx_answered(self, sender: str, nonce: int) -> None:
        """A Probed from `sender` (MLX thread)."""
        self.loop.call_soon_threadsafe(self._answered, sender, nonce)

    def _answered(self, sender: str, nonce: int) -> None:
        node, answered = self._waiting.get(nonce, (None, None))
        if node == sender and not answered.done():  # (a nonce is only good from the node it went to)
            answered.set_result(None)


async def _within(answered: asyncio.Future, seconds: float) -> bool:
    """Whether `answered` is done within `seconds` (it is not cancelled either way)."""
    if not answered.done() and seconds > 0:
        await asyncio.wait({answered}, timeout=seconds)
    return answered.done()
