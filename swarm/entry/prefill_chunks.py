"""How many prompt positions the entry sends in one pass (generate.py). Event loop.

Each pass is one whole trip through every stage, and a stage serves other requests only between
two passes of a prompt (stage/stage_service.py). So a prompt that no other request of its entry
waits behind goes in large passes, as mlx_lm.generate reads one in passes of its prefill_step_size:
few trips, and the same float rounding as mlx-lm at that step. As soon as another request runs at
the entry, the next pass is small, so that request's steps meet short passes at the stages.

The choice is made before each pass from the entry's own requests only, so a request alone gets
deterministic boundaries (every `alone` positions from where its caches start, the last prompt
token by itself): tests compare its text with mlx-lm's at that step (tests/reference.py). A stage
serving other entries' requests does not tell this entry: those requests meet its large passes
(one under way at a stage at a time, stage/chunk_hold.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backend import this_backend


@dataclass(frozen=True)
class PrefillChunks:
    small: int  # positions per pass beside other requests of the entry (`--prefill-chunk`)
    alone: int  # positions per pass when no other request runs at the entry

    def __post_init__(self) -> None:
        if not 0 < self.small <= self.alone:
            raise ValueError(f"prefill chunks must be 0 < small <= alone, not {self.small}, {self.alone}")

    @classmethod
    def fixed(cls, step: int) -> PrefillChunks:
        """One size whatever runs beside (`--prefill-chunk` given)."""
        return cls(step, step)

    @classmethod
    def of_backend(cls) -> PrefillChunks:
        backend = this_backend()
        return cls(backend.prefill_chunk, backend.prefill_chunk_alone)

    def next(self, remaining: int, alone: bool) -> int:
        """Positions of the next pass, with `remaining` prompt positions left to read before the last."""
        return min(self.alone if alone else self.small, remaining)
