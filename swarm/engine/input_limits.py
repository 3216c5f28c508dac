"""What a shard may be fed: checked on the frame's raw bytes, before anything is built from them.

A token id past the embedding's rows is not an error MLX reports: the gather reads out of
bounds (silently wrong text up to ~10^6, a SIGSEGV at 10^8). A chunk of thousands of positions,
or positions past the context, cost seconds and gigabytes before anything fails. So every
forward is checked against the model it runs on (the shard knows its embedding's rows and
its width, the model its context) on its raw payload: one int read for a decode step, one
numpy pass for a prefill chunk. Cheap enough for every hop.

Hidden states may come in any of the wire's float dtypes: nodes of one swarm run their own
dtype (float16 on Metal, float32 on a CPU), and a layer takes any of them; their width must be
the model's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

# Positions one frame may carry: what the entry prefills at once (entry/generate.py uses it),
# as mlx_lm.generate does. More would only be an attacker's.
MAX_CHUNK = 2048


@dataclass(frozen=True)
class InputLimits:
    context: int  # positions a request may reach: [pos, pos + length) within [0, context)
    vocab: int | None  # token ids into the first stage must be below this (its embedding's rows)
    hidden: int | None  # the width of hidden states into a later stage
    max_chunk: int = MAX_CHUNK

    def refusal(self, pos: int, shape: tuple[int, ...], payload: bytes | memoryview) -> str | None:
        """Why a forward of `shape` at `pos` (its raw payload, already the right size for its dtype
        and shape: messages.py) must not run here; None when it may."""
        length = shape[1]
        if pos + length > self.context:
            return (f"positions [{pos}, {pos + length}) run past this model's context of {self.context} "
                    f"positions")
        if length > self.max_chunk:
            return f"a chunk of {length} positions; a frame carries at most {self.max_chunk}"
        if self.vocab is not None:
            if length == 1:
                token = int.from_bytes(payload, sys.byteorder, signed=True)
                if not 0 <= token < self.vocab:
                    return self._outside(token)
            else:
                ids = np.frombuffer(payload, np.int32)
                low, high = int(ids.min()), int(ids.max())
                if low < 0 or high >= self.vocab:
                    return self._outside(low if low < 0 else high)
        elif self.hidden is not None and shape[2] != self.hidden:
            return f"hidden states of width {shape[2]}; this model's width is {self.hidden}"
        return None

    def _outside(self, token: int) -> str:
        return f"token id {token} is outside the vocabulary of {self.vocab} tokens"
