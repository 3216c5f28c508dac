"""All stages in this process, chained on the MLX worker thread: a Pipeline for tests and benchmarks."""

from __future__ import annotations

import mlx.core as mx

from swarm.engine.shard_runner import ShardRunner
from swarm.engine.worker import MlxWorker


class LocalPipeline:
    """All stages in this process, chained on the MLX worker thread."""

    def __init__(self, stages: list[ShardRunner], worker: MlxWorker):
        self.stages = stages
        self.worker = worker

    def _run(self, request_id: str, tokens: list[int], start_pos: int, sampling, rules):
        x = mx.array([tokens], dtype=mx.int32)
        for stage in self.stages:
            x = stage.forward(request_id, x, start_pos, sampling, rules=rules if start_pos == 0 else None,
                              ids=tokens if rules is not None else None)
        return x if sampling is not None else None

    async def forward(self, request_id, tokens, start_pos, sampling, continue_unless=None, rules=None):
        return await self.worker.run(self._run, request_id, tokens, start_pos, sampling, rules)

    async def release(self, request_id: str) -> None:
        def _release():
            for stage in self.stages:
                stage.release(request_id)
        await self.worker.run(_release)
