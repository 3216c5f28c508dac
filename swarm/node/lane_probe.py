"""Probes over the data lane: does a peer read what we send it, and soon? (transport/probe_messages.py)

`probe(node, timeout)` (event loop) sends a Probe on the MLX thread, behind whatever waits for that
peer on its link, and waits for its Probed. A peer that does not answer in time takes no data: the
link is broken (what waits on it may never be read: requests on it replay) and planning leaves the
peer out (planning/slow_members.py). The node's inbox hands over each Probed (`mlx_answered`) and
answers the probes of others itself.
"""

from __future__ import annotations

import asyncio
import secrets

from ..engine.worker import MlxWorker
from ..transport.errors import PeerUnreachable
from ..transport.lane import DataLane
from ..transport.probe_messages import Probe


class LaneProbe:
    def __init__(self, lane: DataLane, worker: MlxWorker, loop: asyncio.AbstractEventLoop):
        self.lane, self.worker, self.loop = lane, worker, loop
        self._waiting: dict[int, tuple[str, asyncio.Future]] = {}  # nonce -> (node, its answer)

    async def probe(self, node: str, timeout: float) -> bool:
        """True if `node` answered within `timeout` s; else its link is broken."""
        nonce = secrets.randbits(63)
        answered = self.loop.create_future()
        self._waiting[nonce] = (node, answered)
        try:
            async with asyncio.timeout(timeout):
                opening = await self.worker.run(self._mlx_send, node, Probe(nonce))
                if opening is not None:  # its link is being opened: a dial that fails is a peer unreachable
                    await asyncio.wrap_future(opening)
                await answered
            return True
        except PeerUnreachable:
            return False
        except TimeoutError:
            await self.worker.run(self.lane.mlx_break, node, f"it did not answer a probe within {timeout:.0f} s")
            return False
        finally:
            self._waiting.pop(nonce, None)

    def _mlx_send(self, node: str, probe: Probe):
        self.lane.mlx_send(node, probe)
        return self.lane.mlx_opening(node)

    def mlx_answered(self, sender: str, nonce: int) -> None:
        """A Probed from `sender` (MLX thread)."""
        self.loop.call_soon_threadsafe(self._answered, sender, nonce)

    def _answered(self, sender: str, nonce: int) -> None:
        node, answered = self._waiting.get(nonce, (None, None))
        if node == sender and not answered.done():  # (a nonce is only good from the node it went to)
            answered.set_result(None)
