"""The entry's inbox: tokens and errors for the requests this node is the entry of, and its outbox.

On the MLX thread the node's inbox (node/inbox.py) hands over every Token or Error a sender
may send this node (`mlx_answer`): its client waits on the event loop (pending_tokens.py); a
token whose next step was armed starts that step right here (run_ahead.py), or holds a
request's first one to join the steps out (cohort_join.py). An answer for a request we no
longer wait on (`mlx_late`) may still let held steps go.

From the event loop, `post` and `post_release` hand the entry's own messages to the MLX
thread (swarm_pipeline.py's Outbox), which sends them through `send`: a send that fails
becomes an Error for the request, like any stage's failure.

A link that breaks may have lost our frames: if its peer is a stage of the plan, our requests
replay at once (`mlx_link_broken`) rather than wait out the token timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Callable, ContextManager

from partitioner import Plan

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
                 current_plan: Callable[[], Plan | None] = lambda: None):
        """`send`: the stage's send-or-fail (every forward this node sends goes one way); `send_release`:
        the lane's send (PeerUnreachable: that stage is gone); `sending_together`: the lane's cork, so
        that steps sent at once arrive side by side; `current_plan`: the plan planning serves now."""
        self.node_id, self.worker, self.pending, self.run_ahead, self.loop = node_id, worker, pending, run_ahead, loop
        self.send, self.send_release, self.sending_together = send, send_release, sending_together
        self.current_plan = current_plan
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
        self.loop.call_soon_threadsafe(self._on_link_broken, peer, problem)

    def _on_link_broken(self, peer: str, problem: str) -> None:
        """A link to `peer` broke (event loop): frames on it may be lost, so if `peer` is a stage of the plan,
        the requests this node is the entry of replay now rather than wait out the token timeout."""
        plan = self.current_plan()
        if plan is not None and peer in {s.node_id for s in plan.stages}:
            self.pending.break_all(f"the link to {peer} broke ({problem})")

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
