"""The entry node's generation loop: prompt in, token ids out.

The entry node keeps the whole token history of a request. If the pipeline breaks
mid-request (a stage died), it waits for a whole pipeline again and replays the
history to rebuild the KV caches, then continues where it stopped: tokens already
sent to the client are never drawn or sent twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable

from ..engine.input_limits import MAX_CHUNK
from ..engine.sampling import SamplingParams
from .pipeline import NoPipeline, Pipeline, PipelineBroken

log = logging.getLogger(__name__)

# Same prefill schedule as mlx_lm.generate (prompt[:-1] in chunks, then the last
# token alone), so that greedy output matches it token for token. A stage takes no
# bigger chunk (engine/input_limits.py).
PREFILL_STEP = MAX_CHUNK


@dataclass
class GenerationJob:
    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    eos_ids: frozenset[int] = frozenset()
    generated: list[int] = field(default_factory=list)
    cached: int = 0  # positions the current pipeline's KV caches hold
    route: dict | None = None  # the plan and nodes that produced the last token


# Returns the pipeline to use now (given the one that just broke, if any);
# raises NoPipeline when none can be had in time.
PipelineSource = Callable[[Pipeline | None], Awaitable[Pipeline]]


async def generate_tokens(job: GenerationJob, get_pipeline: PipelineSource,
                          recovery_timeout: float = 30.0) -> AsyncIterator[int]:
    pipeline = await get_pipeline(None)
    broken_since: float | None = None
    try:
        while len(job.generated) < job.max_tokens:
            try:
                token = await _next_token(job, pipeline)
            except PipelineBroken as e:
                now = time.monotonic()
                broken_since = broken_since or now
                if now - broken_since > recovery_timeout:
                    raise NoPipeline(f"the pipeline stayed broken for {recovery_timeout:.0f}s: {e}") from None
                log.warning("request %s: pipeline broke (%s); replaying %d tokens",
                            job.request_id, e, len(job.prompt) + len(job.generated))
                await _release_quietly(pipeline, job.request_id)
                pipeline = await get_pipeline(pipeline)
                job.cached = 0
                continue
            broken_since = None
            if plan := getattr(pipeline, "plan", None):
                job.route = {"entry": getattr(pipeline, "entry", None), "plan_id": plan.plan_id,
                             "path": [s.node_id for s in plan.stages]}
            job.generated.append(token)
            yield token
            if token in job.eos_ids:
                return
    finally:
        await _release_quietly(pipeline, job.request_id)


async def _next_token(job: GenerationJob, pipeline: Pipeline) -> int:
    history = job.prompt + job.generated
    # Everything but the last known token goes through as prefill (no sampling).
    while len(history) - 1 - job.cached > 0:
        n = min(PREFILL_STEP, len(history) - 1 - job.cached)
        await pipeline.forward(job.request_id, history[job.cached:job.cached + n], job.cached, None)
        job.cached += n
    more = len(job.generated) + 1 < job.max_tokens  # after this token, another step is wanted ...
    token = await pipeline.forward(job.request_id, history[-1:], job.cached, job.sampling,
                                   continue_unless=job.eos_ids if more else None)  # ... unless it is EOS
    job.cached += 1
    return int(token)


async def _release_quietly(pipeline: Pipeline, request_id: str) -> None:
    try:
        await asyncio.shield(pipeline.release(request_id))
    except Exception as e:  # a dead stage frees its caches by dying
        log.debug("release of %s failed: %s", request_id, e)
