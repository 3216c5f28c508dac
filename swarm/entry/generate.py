"""The entry node's generation loop: prompt in, token ids out.

The entry node keeps the whole token history of a request. If the pipeline breaks
mid-request (a stage died), it waits for a whole pipeline again and replays the
history to rebuild the KV caches, then continues where it stopped: tokens already
sent to the client are never drawn or sent twice.

A request with decoding rules (a grammar, penalties, logprobs) sends them with the
first forward of every attempt, and its token ids with every forward: the new last
stage rebuilds its sampler from the replayed history (engine/request_sampler.py), so
the output equals an undisturbed run's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Awaitable, Callable

from ..engine.decoding_rules import DecodingRules
from ..engine.input_limits import MAX_CHUNK
from ..engine.sampling import SamplingParams
from ..engine.token_logprobs import SampledToken, TokenLogprobs
from ..planning.errors import NoPipeline
from .pipeline import Pipeline, PipelineBroken

log = logging.getLogger(__name__)

# Same prefill schedule as mlx_lm.generate (prompt[:-1] in chunks, then the last
# token alone), so that greedy output matches it token for token. A stage takes no
# bigger chunk (engine/input_limits.py).
PREFILL_STEP = MAX_CHUNK
# Prompt logprobs (echo) need the logits of every prompt position: (chunk, vocab) floats at a time.
ECHO_PREFILL_STEP = 64


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
    rules: DecodingRules | None = None  # what the last stage's sampler applies (prompt_len set here)
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one row per generated token, if asked
    prompt_logprobs: TokenLogprobs | None = None  # rows of prompt tokens 1.. (echo), once they came

    def rules_now(self) -> DecodingRules | None:
        """The rules for the next attempt: prompt logprobs are asked for until they came."""
        rules = self.rules
        if rules is not None and rules.echo_logprobs and self.prompt_logprobs is not None:
            rules = replace(rules, echo_logprobs=False)
        return rules


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
    rules = job.rules_now()
    step = ECHO_PREFILL_STEP if rules is not None and rules.echo_logprobs else PREFILL_STEP
    # Everything but the last known token goes through as prefill (no sampling).
    while len(history) - 1 - job.cached > 0:
        n = min(step, len(history) - 1 - job.cached)
        await pipeline.forward(job.request_id, history[job.cached:job.cached + n], job.cached, None, rules=rules)
        job.cached += n
    more = len(job.generated) + 1 < job.max_tokens  # after this token, another step is wanted ...
    token = await pipeline.forward(job.request_id, history[-1:], job.cached, job.sampling,
                                   continue_unless=job.eos_ids if more else None,  # ... unless it is EOS
                                   rules=rules)
    job.cached += 1
    if isinstance(token, SampledToken):
        rows = token.logprobs
        if rules.echo_logprobs:
            job.prompt_logprobs = TokenLogprobs(rows.ids[:-1], rows.logprobs[:-1])
        job.logprobs.append(TokenLogprobs(rows.ids[-1:], rows.logprobs[-1:]))
        token = token.token
    return int(token)


async def _release_quietly(pipeline: Pipeline, request_id: str) -> None:
    try:
        await asyncio.shield(pipeline.release(request_id))
    except Exception as e:  # a dead stage frees its caches by dying
        log.debug("release of %s failed: %s", request_id, e)
