"""The entry node's generation loop: prompt in, token ids out.

The entry node keeps the whole token history of a request. If the pipeline breaks
mid-request (a stage died), it waits for a whole pipeline again and replays the
history to rebuild the KV caches, then continues where it stopped: tokens already
sent to the client are never drawn or sent twice.

A request with decoding rules (a grammar, penalties, logprobs) sends them with the
first forward of every attempt, and its token ids with every forward: the new last
stage rebuilds its sampler from the replayed history (engine/request_sampler.py), so
the output equals an undisturbed run's.

A request whose history begins with tokens an earlier request left in the stages' prompt
caches starts from them (engine/prompt_cache.py, entry/prompt_index.py): the pipeline says how
many positions, every stage starts from exactly those, and the rest is prefilled as usual. A
stage that does not hold them answers a miss, and the request runs again cold at once: not a
failure, not a replay the client could see. At the end the stages are told which tokens the
request's caches hold, to keep them for the next turn.

A request that speculates (speculation.py) sends draft tokens with its decode steps, and a step brings
the drafts its last stage accepted and the token after them: its history (and a replay's) holds those
only, and its position moves past them, where every stage cuts its caches back to (a stop or max_tokens
inside them ends it there, and the stages keep only what it kept). Drafts from a draft model are computed on
the MLX thread while this loop awaits them; its cache for the request follows the accepted history by
itself (draft_model.py), a replay's too, and is freed when the request ends, however it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Awaitable, Callable

from ..backend import this_backend
from ..engine.decoding_rules import DecodingRules
from ..engine.sampling import SamplingParams
from ..engine.token_logprobs import SampledToken, TokenLogprobs
from ..planning.errors import NoPipeline
from .pipeline import Pipeline, PipelineBroken, PrefixMissed, Verified
from .prompt_chunks import next_chunk
from .prompt_index import Reuse
from .speculation import Speculation

log = logging.getLogger(__name__)

# The prefill schedule of mlx_lm.generate (prompt[:-1] in chunks, then the last token alone): in
# large chunks while no other request of the entry runs, in chunks of `--prefill-chunk` positions
# beside one (prompt_chunks.py); alone throughout, greedy output matches mlx-lm's at prefill_step_size
# = the large chunk token for token. Each stage serves other requests between two chunks of a prompt
# (stage/stage_service.py), so a chunk is what a long prompt holds a short request back. Both sizes'
# defaults are the backend's (backend.py: small on a CPU, where a chunk's pass is slow). A stage
# takes no bigger chunk than MAX_CHUNK (engine/input_limits.py).
# Prompt logprobs (echo) need the logits of every prompt position: (chunk, vocab) floats at a time.
ECHO_PREFILL_STEP = 64


def default_prefill_step() -> int:
    """Positions per prompt chunk when `--prefill-chunk` is not given: this process's backend's."""
    return this_backend().prefill_chunk


def default_prefill_alone() -> int:
    """Positions per chunk of a prompt no other request waits behind: this process's backend's."""
    return this_backend().prefill_chunk_alone


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
    may_reuse: bool = True  # may start from a prefix the stages keep (not after a miss)
    reused: Reuse | None = None  # what the current attempt started from, until its first token came
    attempt: int = 0  # restarts so far (a replay, a miss): the stages tell attempts apart
    prefill_step: int = field(default_factory=default_prefill_step)  # positions per prompt chunk beside others
    prefill_alone: int = field(default_factory=default_prefill_alone)  # ... alone (at least prefill_step)
    prefilling: bool = True  # its prompt (or a replay's history) is being read
    speculation: Speculation | None = None  # its decode steps carry drafts (speculation.py); None: never
    prompt_chunks: int = 0  # prompt chunks sent so far (every attempt's; /health sums them)

    def reusable_now(self) -> bool:
        """Prompt logprobs need every prompt position computed: such a request runs cold."""
        return self.may_reuse and not (self.rules is not None and self.rules.echo_logprobs
                                       and self.prompt_logprobs is None)

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
                tokens = await _next_tokens(job, pipeline)
            except PrefixMissed as e:
                log.info("request %s: %s; running it cold", job.request_id, e)
                if job.reused is not None:
                    pipeline.prompts.missed(job.prompt + job.generated, job.reused)
                job.cached, job.reused, job.may_reuse = 0, None, False  # position 0 restarts it on every stage
                job.attempt += 1
                continue
            except PipelineBroken as e:
                now = time.monotonic()
                broken_since = broken_since or now
                job.reused = None
                if now - broken_since > recovery_timeout:
                    job.cached = 0  # (what the broken attempt's caches hold is not known)
                    raise NoPipeline(f"the pipeline stayed broken for {recovery_timeout:.0f}s: {e}") from None
                log.warning("request %s: pipeline broke (%s); replaying %d tokens",
                            job.request_id, e, len(job.prompt) + len(job.generated))
                await _release_quietly(pipeline, job.request_id)
                pipeline = await get_pipeline(pipeline)
                log.info("request %s: a whole pipeline again: replaying", job.request_id)
                job.cached = 0
                job.attempt += 1
                continue
            broken_since = None
            if plan := getattr(pipeline, "plan", None):
                job.route = {"entry": getattr(pipeline, "entry", None), "plan_id": plan.plan_id,
                             "path": [s.node_id for s in plan.stages]}
            for token in tokens[:job.max_tokens - len(job.generated)]:
                job.generated.append(token)
                yield token
                if token in job.eos_ids:
                    return
    finally:
        if job.speculation is not None:
            job.speculation.close()  # (a draft model's cache for it)
        # (a request that stopped mid-prefill holds fewer positions on some stage: that stage keeps nothing)
        await _release_quietly(pipeline, job.request_id, (job.prompt + job.generated)[:job.cached])


async def _next_tokens(job: GenerationJob, pipeline: Pipeline) -> list[int]:
    """The next step's tokens: one, or the drafts accepted and the token after them."""
    history = job.prompt + job.generated
    rules = job.rules_now()
    echo = rules is not None and rules.echo_logprobs
    step, alone_step = (ECHO_PREFILL_STEP, ECHO_PREFILL_STEP) if echo else (job.prefill_step, job.prefill_alone)
    prefix = None
    if job.cached == 0 and job.reusable_now():
        job.reused = pipeline.prompts.reusable(history)
        if job.reused is not None:
            job.cached = job.reused.length
            prefix = history[:job.cached]
    # Everything but the last known token goes through as prefill (no sampling).
    job.prefilling = len(history) - 1 - job.cached > 0
    spec = job.speculation if not job.prefilling and prefix is None and job.cached > 0 else None
    while len(history) - 1 - job.cached > 0:
        n = next_chunk(len(history) - 1 - job.cached, step, alone_step, pipeline.alone(job.request_id))
        await pipeline.forward(job.request_id, history[job.cached:job.cached + n], job.cached, None, rules=rules,
                               prefix=prefix, attempt=job.attempt)
        job.cached += n
        job.prompt_chunks += 1
        prefix = None
    more = len(job.generated) + 1 < job.max_tokens  # after this token, another step is wanted ...
    drafts: list[int] = []
    ahead = more
    if job.speculation is not None:
        crowded = not pipeline.alone(job.request_id)
        if spec is not None:
            drafts = await spec.next_drafts(history, job.max_tokens - len(job.generated) - 1, crowded)
        ahead = more and not drafts and job.speculation.may_run_ahead(crowded)  # (a step with drafts never)
    token = await pipeline.forward(job.request_id, history[-1:], job.cached, job.sampling,
                                   continue_unless=job.eos_ids if ahead else None,  # ... unless it is EOS
                                   rules=rules, prefix=prefix, attempt=job.attempt,
                                   **({"drafts": drafts} if drafts else {}))  # (only a step with drafts asks them)
    job.prefilling = False
    if job.reused is not None:
        job.reused = None
        pipeline.prompts.hit()
    if isinstance(token, Verified):
        job.speculation.checked(token.drafted, len(token.tokens) - 1)
        job.cached += len(token.tokens)  # the last token and the accepted drafts
        if token.logprobs is not None:
            rows = token.logprobs
            job.logprobs += [TokenLogprobs(rows.ids[i:i + 1], rows.logprobs[i:i + 1]) for i in range(rows.rows)]
        return token.tokens
    job.cached += 1
    if isinstance(token, SampledToken):
        rows = token.logprobs
        if rules.echo_logprobs:
            job.prompt_logprobs = TokenLogprobs(rows.ids[:-1], rows.logprobs[:-1])
        job.logprobs.append(TokenLogprobs(rows.ids[-1:], rows.logprobs[-1:]))
        token = token.token
    return [int(token)]


async def _release_quietly(pipeline: Pipeline, request_id: str, keep: list[int] | None = None) -> None:
    try:
        await asyncio.shield(pipeline.release(request_id, keep or None))
    except Exception as e:  # a dead stage frees its caches by dying
        log.debug("release of %s failed: %s", request_id, e)
