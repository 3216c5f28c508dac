"""Log-probabilities of tokens under the model's own distribution, and how they travel.

The logprob of a token is the raw log-softmax of the model's logits at that
position: before logit bias, penalties, a grammar's mask or temperature (what the
model itself says; vLLM's default too). One row per position: column 0 is the token
that stands there (sampled, or the prompt's own for echo), columns 1..k the k most
likely tokens, best first. Rows travel back to the entry as two arrays in the
Token message's payload (transport/messages.py).
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np


class TokenLogprobs(NamedTuple):
    ids: np.ndarray  # int32 (rows, 1 + k)
    logprobs: np.ndarray  # float32 (rows, 1 + k)

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    def to_bytes(self) -> bytes:
        return self.ids.astype("<i4").tobytes() + self.logprobs.astype("<f4").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, rows: int, cols: int) -> "TokenLogprobs":
        n = rows * cols
        flat = np.frombuffer(data, dtype=np.uint8)
        ids = flat[:4 * n].view("<i4").reshape(rows, cols).astype(np.int32)
        lps = flat[4 * n:8 * n].view("<f4").reshape(rows, cols).astype(np.float32)
        return cls(ids, lps)

    @classmethod
    def concat(cls, parts: list["TokenLogprobs"]) -> "TokenLogprobs":
        return cls(np.concatenate([p.ids for p in parts]), np.concatenate([p.logprobs for p in parts]))


class SampledToken(NamedTuple):
    """A sampled token with its logprobs row(s) (prompt rows first when echo asked for them)."""

    token: int
    logprobs: TokenLogprobs


def log_softmax(logits: mx.array) -> np.ndarray:
    """(..., vocab) logits -> float32 log-probabilities, in numpy (the rows are read on the CPU)."""
    x = logits.astype(mx.float32)
    return np.array(x - mx.logsumexp(x, axis=-1, keepdims=True))


def rows_of(logprobs: np.ndarray, chosen: list[int], k: int) -> TokenLogprobs:
    """logprobs (rows, vocab), the token standing at each row -> rows [chosen, top-k best first]."""
    n = logprobs.shape[0]
    ids = np.empty((n, 1 + k), np.int32)
    lps = np.empty((n, 1 + k), np.float32)
    ids[:, 0] = chosen
    lps[:, 0] = logprobs[np.arange(n), chosen]
    if k:
        top = np.argpartition(-logprobs, k - 1, axis=-1)[:, :k]
        vals = np.take_along_axis(logprobs, top, axis=-1)
        order = np.argsort(-vals, axis=-1, kind="stable")
        ids[:, 1:] = np.take_along_axis(top, order, axis=-1)
        lps[:, 1:] = np.take_along_axis(vals, order, axis=-1)
    return TokenLogprobs(ids, lps)


def top_of(logprobs: mx.array, top: mx.array | None, chosen: int) -> TokenLogprobs:
    """One row from evaluated log-probabilities (vocab,) and the ids of its k best: the chosen token's
    logprob, then the k best, best first."""
    k = 0 if top is None else top.shape[0]
    ids = np.empty((1, 1 + k), np.int32)
    lps = np.empty((1, 1 + k), np.float32)
    ids[0, 0], lps[0, 0] = chosen, logprobs[chosen].item()
    if k:
        top_ids = np.array(top)
        vals = np.array(logprobs[top])
        order = np.lexsort((top_ids, -vals))  # best first; ties by id, so a replay orders them alike
        ids[0, 1:] = top_ids[order]
        lps[0, 1:] = vals[order]
    return TokenLogprobs(ids, lps)
