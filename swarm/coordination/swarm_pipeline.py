"""The entry node's view of one agreed plan as a Pipeline (see inference/pipeline.py)."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from partitioner import Plan

from ..engine.sampling import SamplingParams
from ..hop_trace import STEP_START, mark
from ..inference.pipeline import PipelineBroken
from ..transport.errors import PeerUnreachable
from . import messages as msg
from .hop_timing import HopTiming
from .pending_tokens import PendingTokens
from .router import Router
from .run_ahead import RunAhead

log = logging.getLogger(__name__)


class SwarmPipeline:
    def __init__(self, plan: Plan, router: Router, pending: PendingTokens, token_timeout: float,
                 timing: HopTiming | None = None, run_ahead: RunAhead | None = None):
        self.plan, self.router, self.pending, self.token_timeout = plan, router, pending, token_timeout
        self.timing = timing
        # Only when we are the first stage: our MLX thread can start the next step itself.
        self.run_ahead = run_ahead if plan.stages[0].node_id == router.node_id else None
        self._background: set[asyncio.Task] = set()

    @property
    def entry(self) -> str:
        return self.router.node_id

    @property
    def path(self) -> list[str]:
        return [s.node_id for s in self.plan.stages]

    async def forward(self, request_id: str, tokens: list[int], start_pos: int,
                      sampling: SamplingParams | None, continue_unless: frozenset[int] | None = None) -> int | None:
        """`continue_unless`: the caller will want the next step too, unless the token is one of these
        (see run_ahead.py); None: it may not."""
        first, plan_id = self.plan.stages[0], self.plan.plan_id
        ids = np.asarray([tokens], dtype=np.int32)
        header = {**msg.forward(request_id, plan_id, start_pos, first.start, self.router.node_id,
                                sampling.to_dict() if sampling else None),
                  "dtype": "int32", "shape": list(ids.shape)}
        at = start_pos + len(tokens)
        fut = self.pending.expect(request_id, plan_id, at) if sampling else None
        started = self.run_ahead.started(request_id, plan_id, start_pos, tokens) if self.run_ahead else None
        t0 = started or time.perf_counter()
        if started is None:
            if fut is not None:
                mark(STEP_START, header)
            try:
                await self.router.send(first.node_id, header, ids.tobytes())
            except PeerUnreachable as e:
                if fut is not None:
                    fut.cancel()
                raise PipelineBroken(str(e)) from None
        if fut is None:
            return None  # prefill: nothing comes back; errors arrive with the next sampled step
        if self.run_ahead is not None and continue_unless is not None:
            self.pending.expect(request_id, plan_id, at + 1)  # that step's token may beat our next call
            self.run_ahead.arm(request_id, plan_id, at, header["sampling"], continue_unless)
        answer = await self.pending.wait(request_id, fut, self.token_timeout)
        if len(tokens) == 1 and self.timing is not None:
            # A step ends when the next one can start: when the token reached our MLX thread if that
            # thread started the next step (run_ahead.py), when it reached us here if not.
            ended = answer.get(RunAhead.NEXT_STARTED) or time.perf_counter()
            self.timing.record(ended - t0, answer.get("cu") or 0, self.hops)
        return answer["token"]

    @property
    def hops(self) -> int:
        """Network messages per step: one per stage boundary, plus entry -> stage 0 and last stage -> entry
        when those are other nodes."""
        stages = self.path
        return len(stages) - 1 + (stages[0] != self.entry) + (stages[-1] != self.entry)

    async def release(self, request_id: str) -> None:
        if self.run_ahead is not None:
            self.run_ahead.forget(request_id)
        self.pending.forget(request_id)
        # In the background: a dead stage must not delay the request that is recovering.
        task = asyncio.create_task(self._release(request_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, request_id: str) -> None:
        for stage in self.plan.stages:
            try:
                await self.router.send(stage.node_id, msg.release(request_id))
            except PeerUnreachable:
                pass
