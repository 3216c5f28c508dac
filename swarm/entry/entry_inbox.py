"""The entry's inbox: tokens and errors for the requests this node is the entry of, and its outbox.

On the MLX thread the node's inbox (node/inbox.py) hands over every Token or Error a sender
may send this node (`mlx_answer`): its client waits on the event loop (pending_tokens.py); a
token whose next step was armed starts that step right here (run_ahead.py), or holds a
request's first one to join the steps out (cohort_join.py). An answer for a request we no
longer wait on (`mlx_late`) may still let held steps go.

From the event loop, `post` and `post_release` hand the entry's own messages to the MLX
thread (swarm_pipeline.py's Outbox), which sends them through `send`: a send that fails
becomes an Error for the request, like any stage's failure.

A link that breaks may have lost our frames: our requests through its peer, on whichever plan,
replay at once (`mlx_link_broken`: planning knows which plans it is a stage of) rather than wait out
the token timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Callable, ContextManager

from ..engine.worker import MlxWorker
from ..transport.errors import PeerUnreachable
from ..transport.messages import Error, Forward, Release, Token
from .cohort_join import CohortJoin
from .pending_tokens import PendingTokens
from .run_ahead import NextStep, RunAhead

SendOrFail = Callable[[str, Forward], bool]  # MLX thread: True if sent, else an Error reaches the entry


class EntryInbox:
    def __init__(self, node_id: str, worker: MlxWorker, pending: PendingTokens, run_ahead: RunAhead,
                 loop: asyncio.AbstractEventLoop, send: SendOrFail, send_release: Callable[[str, Release], None],
                 sending_together: Callable[[], ContextManager] = contextlib.nullcontext,
                 stage_lost: Callable[[str, str], None] = lambda node, reason: None):
        """`send`: the stage's send-or-fail (every forward this node sends goes one way); `send_release`:
        the lane's send (PeerUnreachable: that stage is gone); `sending_together`: the lane's cork, so
        that steps sent at once arrive side by side; `stage_lost(node, reason)`: breaks the requests on
        every plan `node` is a stage of (event loop; planning/coordinator.py)."""
        self.node_id, self.worker, self.pending, self.run_ahead, self.loop = node_id, worker, pending, run_ahead, loop
        self.send, self.send_release, self.sending_together = send, send_release, sending_together
        self.stage_lost = stage_lost
        self.joins = CohortJoin(node_id)  # our requests' first decode steps join the cohort out; MLX thread

    # -- event loop: the entry's outbox (swarm_pipeline.py) ---------------------------------
    def post(self, node_id: str, forward: Forward) -> None:
        self.worker.post(self._mlx_send, node_id, forward)

    def post_release(self, rid: str, node_ids: list[str], keep: list[int] | None = None, attempt: int = 0) -> None:
        """`keep`: the ids of the positions the request's caches hold, for the stages' prompt caches;
        `attempt`: the latest the request sent (its frames still on the way are dropped)."""
        self.worker.post(self._mlx_release_everywhere, rid, node_ids, keep, attempt)

    # -- MLX thread -------------------------------------------------------------------------
    def mlx_answer(self, message: Token | Error) -> None:
        """A token or error for a request this node is the entry of: its client waits on the loop."""
        started = None
        if isinstance(message, Token):
            step = self.run_ahead.mlx_next_step(message)
            if step is not None:
                started = step.started
            to_send = self.joins.mlx_token(message.rid, message.at, step)
        else:
            to_send = self.joins.mlx_error(message.rid)
        self._mlx_send_steps(to_send)
        self.loop.call_soon_threadsafe(self.pending.resolve, message, started)

    def mlx_late(self) -> None:
        """An answer came for a request we no longer wait on: steps held for it may go now."""
        self._mlx_send_steps(self.joins.mlx_flush_if_alone())

    def mlx_link_broken(self, peer: str, problem: str) -> None:
        """A link to `peer` broke: frames on it may be lost, so the requests this node is the entry of
        through `peer` replay now rather than wait out the token timeout. Which plans those are is asked
        on the event loop, not here: planning may have left `peer` out of its newest plan already (a probe
        of a dead stage fails as its link breaks), while requests still run on a plan with it."""
        self.loop.call_soon_threadsafe(self.stage_lost, peer, f"the link to {peer} broke ({problem})")

    def _mlx_send(self, node_id: str, forward: Forward) -> None:
        if self.send(node_id, forward):
            self.joins.mlx_sent(node_id, forward)

    def _mlx_send_steps(self, steps: list[NextStep]) -> None:
        if len(steps) == 1:
            self._mlx_send(steps[0].to, steps[0].forward)
            return
        with self.sending_together():  # they arrive side by side, to be batched
            for step in steps:
                self._mlx_send(step.to, step.forward)

    def _mlx_release_everywhere(self, rid: str, node_ids: list[str], keep: list[int] | None = None,
                                attempt: int = 0) -> None:
        waiting = self.joins.mlx_released(rid)  # (steps held for it to come back may go now)
        release = Release.keeping(rid, keep, attempt)
        for node_id in node_ids:
            try:
                self.send_release(node_id, release)  # to us: handed to our stage at once
            except PeerUnreachable:
                pass  # a dead stage freed its caches by dying
        self._mlx_send_steps(waiting)
