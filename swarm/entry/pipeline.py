"""What the entry node needs from a pipeline, wherever its stages run.

A pipeline takes token ids for positions [start_pos, start_pos + n) of a request,
carries them through every stage, and (when asked to sample) returns the token the
last stage drew for the next position.
"""

from __future__ import annotations

from typing import Protocol

from ..engine.sampling import SamplingParams


class PipelineBroken(Exception):
    """The pipeline lost a stage or its state; the caller may replay once it is whole again."""


class NoPipeline(Exception):
    """No whole pipeline could be had in time (peers gone, or the swarm cannot hold the model)."""


class Pipeline(Protocol):
    async def forward(self, request_id: str, tokens: list[int], start_pos: int,
                      sampling: SamplingParams | None, continue_unless: frozenset[int] | None = None) -> int | None:
        """continue_unless: a hint that the caller will want the next step unless the token is in it."""

    async def release(self, request_id: str) -> None: ...
