"""The entry node's view of one agreed plan as a Pipeline (see inference/pipeline.py)."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from partitioner import Plan

from ..engine.sampling import SamplingParams
from ..hop_trace import STEP_END, STEP_START, mark
from ..inference.pipeline import PipelineBroken
from ..transport.errors import PeerUnreachable
from . import messages as msg
from .hop_timing import HopTiming
from .pending_tokens import PendingTokens
from .router import Router

log = logging.getLogger(__name__)


class SwarmPipeline:
    def __init__(self, plan: Plan, router: Router, pending: PendingTokens, token_timeout: float,
                 timing: HopTiming | None = None):
        self.plan, self.router, self.pending, self.token_timeout = plan, router, pending, token_timeout
        self.timing = timing
        self._background: set[asyncio.Task] = set()

    @property
    def entry(self) -> str:
        return self.router.node_id

    @property
    def path(self) -> list[str]:
        return [s.node_id for s in self.plan.stages]

    async def forward(self, request_id: str, tokens: list[int], start_pos: int,
                      sampling: SamplingParams | None) -> int | None:
        first = self.plan.stages[0]
        ids = np.asarray([tokens], dtype=np.int32)
        header = {**msg.forward(request_id, self.plan.plan_id, start_pos, first.start, self.router.node_id,
                                sampling.to_dict() if sampling else None),
                  "dtype": "int32", "shape": list(ids.shape)}
        at = start_pos + len(tokens)
        fut = self.pending.expect(request_id, self.plan.plan_id, at) if sampling else None
        t0 = time.perf_counter()
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
        answer = await self.pending.wait(request_id, fut, self.token_timeout)
        mark(STEP_END, header)
        if len(tokens) == 1 and self.timing is not None:
            self.timing.record(time.perf_counter() - t0, answer.get("cu") or 0, self.hops)
        return answer["token"]

    @property
    def hops(self) -> int:
        """Network messages per step: one per stage boundary, plus entry -> stage 0 and last stage -> entry
        when those are other nodes."""
        stages = self.path
        return len(stages) - 1 + (stages[0] != self.entry) + (stages[-1] != self.entry)

    async def release(self, request_id: str) -> None:
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
