"""What the entry node needs from a pipeline, wherever its stages run.

A pipeline takes token ids for positions [start_pos, start_pos + n) of a request,
carries them through every stage, and (when asked to sample) returns the token the
last stage drew for the next position.
"""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx

from ..engine.sampling import SamplingParams
from ..engine.shard_runner import ShardRunner
from ..engine.worker import MlxWorker


class PipelineBroken(Exception):
    """The pipeline lost a stage or its state; the caller may replay once it is whole again."""


class NoPipeline(Exception):
    """No whole pipeline could be had in time (peers gone, or the swarm cannot hold the model)."""


class Pipeline(Protocol):
    async def forward(self, request_id: str, tokens: list[int], start_pos: int,
                      sampling: SamplingParams | None, continue_unless: frozenset[int] | None = None) -> int | None:
        """continue_unless: a hint that the caller will want the next step unless the token is in it."""

    async def release(self, request_id: str) -> None: ...


class LocalPipeline:
    """All stages in this process, chained on the MLX worker thread."""

    def __init__(self, stages: list[ShardRunner], worker: MlxWorker):
        self.stages = stages
        self.worker = worker

    def _run(self, request_id: str, tokens: list[int], start_pos: int, sampling):
        x = mx.array([tokens], dtype=mx.int32)
        for stage in self.stages:
            x = stage.forward(request_id, x, start_pos, sampling)
        return x if sampling is not None else None

    async def forward(self, request_id, tokens, start_pos, sampling, continue_unless=None):
        return await self.worker.run(self._run, request_id, tokens, start_pos, sampling)

    async def release(self, request_id: str) -> None:
        def _release():
            for stage in self.stages:
                stage.release(request_id)
        await self.worker.run(_release)
