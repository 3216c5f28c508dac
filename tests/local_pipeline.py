"""All stages in this process, chained on the MLX worker thread: a Pipeline for tests and benchmarks."""

from __future__ import annotations

import asyncio

import mlx.core as mx

from swarm.engine.prompt_cache import PromptCacheMiss
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.engine.worker import MlxWorker
from swarm.engine.draft_check import Checked
from swarm.entry.generate import GenerationJob, generate_tokens
from swarm.entry.pipeline import PrefixMissed, Verified
from swarm.entry.prompt_index import PromptIndex, RoutePrompts

GREEDY = SamplingParams(temperature=0.0)


class LocalPipeline:
    """All stages in this process, chained on the MLX worker thread. With `prompts` (an entry's index),
    finished requests leave their caches in the stages' prompt caches and later ones start from them."""

    def __init__(self, stages: list[ShardRunner], worker: MlxWorker, prompts: PromptIndex | None = None):
        self.stages = stages
        self.worker = worker
        self.index = prompts
        self.running: set[str] = set()  # requests that sent a frame and were not released

    @property
    def prompts(self) -> RoutePrompts:
        return RoutePrompts(self.index, self.route)  # (a test may change the stages, or the route)

    @property
    def route(self) -> tuple:
        """Which stages hold which layers (entry/prompt_index.py): other stages, another route."""
        return tuple((id(s), s.range.start, s.range.end) for s in self.stages)

    def alone(self, request_id: str) -> bool:
        return len(self.running) <= (request_id in self.running)

    def _run(self, request_id: str, tokens: list[int], start_pos: int, sampling, rules, prefix, drafts=None):
        tokens = tokens + (drafts or [])
        x = mx.array([tokens], dtype=mx.int32)
        starts = start_pos == 0 or prefix is not None
        for stage in self.stages:
            x = stage.forward(request_id, x, start_pos, sampling, rules=rules if starts else None,
                              ids=tokens if rules is not None else None, prefix=prefix, drafts=drafts or None)
        if isinstance(x, Checked):
            return Verified.of(drafts, x.accepted, x.token, x.logprobs)
        return x if sampling is not None else None

    async def forward(self, request_id, tokens, start_pos, sampling, continue_unless=None, rules=None, prefix=None,
                      attempt=0, drafts=None):
        self.running.add(request_id)
        try:
            return await self.worker.run(self._run, request_id, tokens, start_pos, sampling, rules, prefix, drafts)
        except PromptCacheMiss as e:
            raise PrefixMissed(str(e)) from None

    async def release(self, request_id: str, keep: list[int] | None = None) -> None:
        self.running.discard(request_id)
        keep = self.prompts.keeping(keep)

        def _release():
            for stage in self.stages:
                stage.release(request_id, keep=keep)
        await self.worker.run(_release)


def ranges(sizes: list[int]) -> list[tuple[int, int]]:
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    return list(zip(bounds, bounds[1:]))


class Stages:
    """A split of the model as real shard runners on one MLX thread, and a request run through them."""

    def __init__(self, model_dir, sizes: list[int]):
        self.worker = MlxWorker()
        self.stages = [ShardRunner(self.worker.run_sync(load_shard, model_dir, a, b)) for a, b in ranges(sizes)]
        self.pipeline = LocalPipeline(self.stages, self.worker)

    def run(self, prompt, n, sampling=GREEDY, speculation=None, rules=None, job_out=None):
        async def pipe(_broken=None):
            return self.pipeline

        async def go():
            job = GenerationJob("r1", prompt, sampling, n, speculation=speculation,
                                rules=None if rules is None else rules)
            if job_out is not None:
                job_out.append(job)
            return [t async for t in generate_tokens(job, pipe)]
        tokens = asyncio.run(go())
        assert all(s.active_requests == 0 for s in self.stages), "caches must be freed at the end"
        return tokens

    def close(self):
        self.worker.close()
