"""What the entry node needs from a pipeline, wherever its stages run.

A pipeline takes token ids for positions [start_pos, start_pos + n) of a request,
carries them through every stage, and (when asked to sample) returns the token the
last stage drew for the next position.
"""

from __future__ import annotations

from typing import Protocol

from ..engine.decoding_rules import DecodingRules
from ..engine.sampling import SamplingParams
from ..engine.token_logprobs import SampledToken
from .prompt_index import RoutePrompts


class PipelineBroken(Exception):
    """The pipeline lost a stage or its state; the caller may replay once it is whole again."""


class PrefixMissed(PipelineBroken):
    """A stage did not hold the kept prefix the request started from: run it again cold, at once."""


class Pipeline(Protocol):
    prompts: RoutePrompts  # what this entry left in these stages' prompt caches

    async def forward(self, request_id: str, tokens: list[int], start_pos: int, sampling: SamplingParams | None,
                      continue_unless: frozenset[int] | None = None, rules: DecodingRules | None = None,
                      prefix: list[int] | None = None, attempt: int = 0) -> int | SampledToken | None:
        """Without `sampling` (a prompt chunk) it returns None once the pipeline may take the next chunk.
        continue_unless: a hint that the caller will want the next step unless the token is in it.
        rules: the request's decoding rules, if any (they start with its first forward; every step of such
        a request carries its token ids to the last stage). A SampledToken when they ask for logprobs.
        prefix: the ids of positions [0, start_pos), which the stages keep: the request starts from them
        (a stage that does not hold them makes the request's next token raise PrefixMissed).
        attempt: how many times the request started again (a replay, a miss): the stages drop frames and
        answers of its earlier attempts."""

    def alone(self, request_id: str) -> bool:
        """Whether no other request of this entry runs beside `request_id` now (its prompt may go in
        large chunks: prompt_chunks.py)."""

    async def release(self, request_id: str, keep: list[int] | None = None) -> None:
        """keep: the ids of the positions the request's caches hold, for the stages to keep (prompt caches)."""
