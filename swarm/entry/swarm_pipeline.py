"""The entry node's view of one agreed plan as a Pipeline (see pipeline.py). Event loop.

Every message leaves through the outbox: the entry's inbox posts it to the MLX
thread, whose data lane sends it (or queues it for our own stage 0). A send that
fails comes back as an Error message for the request, like any stage's failure.

A prompt goes out in chunks (entry/generate.py), a few of a request's at a time: the last stage
answers each chunk it has read, and the next one leaves then. So a stage never holds a long
prompt's backlog ahead of other requests' work (a release stops it at the chunk under way), and
the token timeout bounds the wait for one chunk, not for the whole prompt: a prompt that is being
read is alive however long it is. A prompt alone at its entry keeps one chunk per stage out and
one travelling: every stage has a chunk to read while the answers travel, and a prompt of a few
chunks goes out whole. Beside another request of this entry it keeps PROMPT_CHUNKS_OUT out, so
that request's steps meet fewer chunks at the stages. Whether a request is alone also sets its next
chunk's size (`alone`, entry/prompt_chunks.py): large alone, small beside others.

A stage may take our frames and return nothing (it reads none of them): a sampled step, or a
request's first prompt chunk, whose answer is overdue (StepWatch) has its plan's stages checked,
again each time as long again passes without it, and one that takes no data is left out, which
breaks the request's plan and replays it around that stage.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Awaitable, Callable, Protocol

from partitioner import Plan

from ..engine.decoding_rules import DecodingRules
from ..engine.sampling import SamplingParams
from ..engine.token_logprobs import SampledToken
from ..transport.messages import Forward
from .hop_timing import HopTiming
from .own_requests import OwnRequests
from .pending_tokens import PendingTokens
from .pipeline import Verified
from .prompt_index import PromptIndex, RoutePrompts, route_of
from .run_ahead import RunAhead

PROMPT_CHUNKS_OUT = 2  # beside other requests: one being read while the next travels


class StepWatch(Protocol):
    """When a step is overdue, and whom to tell (planning/coordinator.py)."""

    def overdue_after(self, plan: Plan, positions: int) -> float:
        """Seconds after which a sampled step of `plan` computing `positions` positions is overdue."""

    def step_overdue(self, plan: Plan, why: str) -> None:
        """A step of `plan` is overdue: its stages may take no data."""


class Outbox(Protocol):
    """How the event loop hands messages to the MLX thread (entry_inbox.py)."""

    def post(self, node_id: str, forward: Forward) -> None:
        """Send `forward` on the MLX thread; if it cannot be, an Error reaches its entry."""

    def post_release(self, rid: str, node_ids: list[str], keep: list[int] | None = None, attempt: int = 0) -> None:
        """Tell these stages to free the request's caches (best effort); `keep`, `attempt`: see Release."""


class SwarmPipeline:
    def __init__(self, plan: Plan, node_id: str, outbox: Outbox, pending: PendingTokens, token_timeout: float,
                 timing: HopTiming, run_ahead: RunAhead, own: OwnRequests, prompts: PromptIndex | None = None,
                 watch: StepWatch | None = None):
        self.plan, self.entry, self.outbox, self.pending = plan, node_id, outbox, pending
        self.token_timeout, self.timing, self.run_ahead, self.own = token_timeout, timing, run_ahead, own
        self.prompts = RoutePrompts(prompts, route_of(plan))
        self._chunks_out: dict[str, deque] = {}  # rid -> (future, positions, watched) of its prompt chunks not answered
        self._attempts: dict[str, int] = {}  # rid -> the attempt its latest forward was of
        self.watch = watch
        self._unanswered: dict[str, int] = {}  # positions sent per request since its last sampled token

    @property
    def path(self) -> list[str]:
        return [s.node_id for s in self.plan.stages]

    async def forward(self, request_id: str, tokens: list[int], start_pos: int, sampling: SamplingParams | None,
                      continue_unless: frozenset[int] | None = None, rules: DecodingRules | None = None,
                      prefix: list[int] | None = None, attempt: int = 0,
                      drafts: list[int] | None = None) -> int | SampledToken | Verified | None:
        """`continue_unless`: the caller will want the next step too, unless the token is one of these
        (see run_ahead.py); None: it may not. `rules`, `prefix`, `attempt`, `drafts`: see pipeline.py."""
        first, plan_id = self.plan.stages[0].node_id, self.plan.plan_id
        self.own.begin(request_id, self.plan)  # only this plan's stages may answer it (node/sender_rules.py)
        if self._attempts.get(request_id) != attempt:
            self._attempts[request_id] = attempt
            self._chunks_out.pop(request_id, None)  # (an earlier attempt's: their answers are not awaited)
        started = self.run_ahead.started(request_id, plan_id, start_pos, tokens)
        checks = drafts is not None
        drafts = drafts if drafts and started is None else []  # (a step run ahead left without drafts)
        at = start_pos + len(tokens) + len(drafts)
        fut = self.pending.expect(request_id, plan_id, at, attempt)  # before sending: errors too
        t0 = started or time.perf_counter()
        positions = self._unanswered.pop(request_id, 0) + len(tokens) + len(drafts)
        with_ids = rules is not None
        starts = start_pos == 0 or prefix is not None
        if started is None:
            self.outbox.post(first, Forward.of_tokens(request_id, plan_id, start_pos, self.entry, sampling, tokens,
                                                      rules if starts else None, with_ids, prefix, attempt,
                                                      drafts))
        if sampling is None:
            self._unanswered[request_id] = positions
            await self._prompt_chunk_out(request_id, fut, len(tokens), watched=starts)
            return None
        self._chunks_out.pop(request_id, None)  # (this step's token comes after every chunk's answer)
        if continue_unless is not None:
            self.pending.expect(request_id, plan_id, at + 1, attempt)  # that step's token may beat our next call
            self.run_ahead.arm(request_id, plan_id, at, sampling, continue_unless, first, with_ids, attempt)
        arrival = await self._wait_watched(request_id, fut, positions)
        if len(tokens) == 1 and not drafts:
            # A step ends when the next one can start: when the token reached our MLX thread if that
            # thread started the next step (run_ahead.py), when it reached us here if not.
            ended = arrival.next_started or time.perf_counter()
            self.timing.record(ended - t0, arrival.token.compute_us, self.hops)
        token = arrival.token
        if checks:
            return Verified.of(drafts, token.accepted if drafts else 0, token.token, token.logprobs)
        return token.token if token.logprobs is None else SampledToken(token.token, token.logprobs)

    async def _prompt_chunk_out(self, request_id: str, answered, positions: int, watched: bool) -> None:
        """A prompt chunk left: wait until fewer of the request's are unanswered than may be out now.
        `watched`: the request's first chunk, which no stage holds back (stage/chunk_hold.py), is
        watched like a sampled step; a later one may be held while others decode, and is not."""
        out = self._chunks_out.setdefault(request_id, deque())
        out.append((answered, positions, watched))
        while len(out) >= self._chunks_allowed_out(request_id):
            fut, n, watch = out.popleft()
            if watch:
                await self._wait_watched(request_id, fut, n, "prompt chunk read")
            else:
                await self.pending.wait(request_id, fut, self.token_timeout, "prompt chunk read")

    def alone(self, request_id: str) -> bool:
        return not self.own.others_than(request_id)

    def _chunks_allowed_out(self, request_id: str) -> int:
        """Alone at this entry: a chunk at every stage and one travelling. Beside another of its requests:
        PROMPT_CHUNKS_OUT (asked again after each answer, so a newcomer drains the surplus)."""
        return PROMPT_CHUNKS_OUT if self.own.others_than(request_id) else len(self.plan.stages) + 1

    async def _wait_watched(self, request_id: str, fut, positions: int, what: str = "token"):
        """The answer's arrival (pending.wait); while it is overdue, the watch is told (again each time
        the step's overdue time passed once more), and we wait on."""
        overdue_s = self.watch.overdue_after(self.plan, positions) if self.watch is not None else None
        if overdue_s is None:
            return await self.pending.wait(request_id, fut, self.token_timeout, what)
        watch, plan = self.watch, self.plan

        def overdue(waited: float) -> None:
            watch.step_overdue(plan, f"no {what} of request {request_id} after {waited:.1f} s")

        return await self.pending.wait(request_id, fut, self.token_timeout, what, (overdue_s, overdue))

    @property
    def hops(self) -> int:
        """Network messages per step: one per stage boundary, plus entry -> stage 0 and last stage -> entry
        when those are other nodes."""
        stages = self.path
        return len(stages) - 1 + (stages[0] != self.entry) + (stages[-1] != self.entry)

    async def release(self, request_id: str, keep: list[int] | None = None) -> None:
        self.own.end(request_id)
        self._unanswered.pop(request_id, None)
        self.run_ahead.forget(request_id)
        self.pending.forget(request_id)
        self._chunks_out.pop(request_id, None)
        self.outbox.post_release(request_id, self.path, self.prompts.keeping(keep), self._attempts.pop(request_id, 0))


class SwarmPipelines:
    """The generation loop's PipelineSource (generate.py): a pipeline on the plan every stage serves."""

    def __init__(self, agreed_plan: Callable[[Plan | None], Awaitable[Plan]], node_id: str, outbox: Outbox,
                 pending: PendingTokens, token_timeout: float, timing: HopTiming, run_ahead: RunAhead,
                 own: OwnRequests, prompts: PromptIndex | None = None, watch: StepWatch | None = None):
        self.agreed_plan, self.node_id, self.outbox, self.pending = agreed_plan, node_id, outbox, pending
        self.token_timeout, self.timing, self.run_ahead, self.own = token_timeout, timing, run_ahead, own
        self.prompts = prompts  # what this entry left in the stages' prompt caches (None: --prompt-cache 0)
        self.watch = watch

    async def __call__(self, broken: SwarmPipeline | None = None) -> SwarmPipeline:
        """Waits for agreement (planning/coordinator.py); NoPipeline when none comes in time."""
        plan = await self.agreed_plan(broken.plan if broken is not None else None)
        return SwarmPipeline(plan, self.node_id, self.outbox, self.pending, self.token_timeout, self.timing,
                             self.run_ahead, self.own, self.prompts, self.watch)
