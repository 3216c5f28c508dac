"""What the entry node needs from a pipeline, wherever its stages run.

A pipeline takes token ids for positions [start_pos, start_pos + n) of a request,
carries them through every stage, and (when asked to sample) returns the token the
last stage drew for the next position. A step may carry draft tokens after the last
token (speculative decoding, speculation.py): it returns the drafts the last stage
accepted and the token it drew after them.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from ..engine.decoding_rules import DecodingRules
from ..engine.sampling import SamplingParams
from ..engine.token_logprobs import SampledToken, TokenLogprobs
from .prompt_index import RoutePrompts


class PipelineBroken(Exception):
    """The pipeline lost a stage or its state; the caller may replay once it is whole again."""


class PrefixMissed(PipelineBroken):
    """A stage did not hold the kept prefix the request started from: run it again cold, at once."""


class Verified(NamedTuple):
    """What a step with drafts brings: the drafts accepted, then the token drawn after them (`tokens`), with a
    logprobs row for each when the request asks for them; `drafted`: how many drafts the step carried."""

    tokens: list[int]
    logprobs: TokenLogprobs | None = None
    drafted: int = 0

    @classmethod
    def of(cls, drafts: list[int], accepted: int, token: int, logprobs: TokenLogprobs | None) -> Verified:
        accepted = min(accepted, len(drafts))  # (a stage that says more: the drafts there were)
        return cls([*drafts[:accepted], token], logprobs, len(drafts))


class Pipeline(Protocol):
    prompts: RoutePrompts  # what this entry left in these stages' prompt caches

    async def forward(self, request_id: str, tokens: list[int], start_pos: int, sampling: SamplingParams | None,
                      continue_unless: frozenset[int] | None = None, rules: DecodingRules | None = None,
                      prefix: list[int] | None = None, attempt: int = 0,
                      drafts: list[int] | None = None) -> int | SampledToken | Verified | None:
        """Without `sampling` (a prompt chunk) it returns None once the pipeline may take the next chunk.
        continue_unless: a hint that the caller will want the next step unless the token is in it.
        rules: the request's decoding rules, if any (they start with its first forward; every step of such
        a request carries its token ids to the last stage). A SampledToken when they ask for logprobs.
        prefix: the ids of positions [0, start_pos), which the stages keep: the request starts from them
        (a stage that does not hold them makes the request's next token raise PrefixMissed).
        attempt: how many times the request started again (a replay, a miss): the stages drop frames and
        answers of its earlier attempts.
        drafts: draft tokens after `tokens` (the last token alone), checked in the same pass: a Verified comes
        back (a step that left without them, run ahead, brings a Verified of its one token)."""

    def alone(self, request_id: str) -> bool:
        """Whether no other request of this entry runs beside `request_id` now (its prompt may go in
        large chunks: prompt_chunks.py)."""

    async def release(self, request_id: str, keep: list[int] | None = None) -> None:
        """keep: the ids of the positions the request's caches hold, for the stages to keep (prompt caches)."""
