"""Token sampling on the last stage.

Randomness comes from a key derived from (seed, absolute position), never from a
global generator: a request replayed through a new pipeline after a node died
draws exactly the same tokens it would have drawn undisturbed.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k filter
    seed: int = 0

    @property
    def greedy(self) -> bool:
        """The most likely token, always (no draw)."""
        return self.temperature <= 0

    def to_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        return cls(float(d["temperature"]), float(d["top_p"]), int(d["top_k"]), int(d["seed"]))


def position_key(seed: int, position: int) -> mx.array:
    # splitmix64-style mixing so neighbouring positions get unrelated keys
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return mx.random.key(z ^ (z >> 31))


def sample(logits: mx.array, params: SamplingParams, position: int) -> int:
    """Pick the token at sequence `position` from the logits (vocab,) of the previous one."""
    return sampled(logits, params, position).item()


def sampled(logits: mx.array, params: SamplingParams, position: int) -> mx.array:
    """sample()'s token, not evaluated: it joins the forward's own evaluation (one sync a step, not two)."""
    if params.greedy:
        return mx.argmax(logits)
    logits = logits.astype(mx.float32) / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = mx.sort(logits)[-params.top_k]
        logits = mx.where(logits < kth, -mx.inf, logits)
    if params.top_p < 1.0:
        order = mx.argsort(-logits)
        probs = mx.softmax(logits[order])
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        drop_sorted = (mx.cumsum(probs) - probs) >= params.top_p
        drop = mx.zeros_like(drop_sorted).at[order].add(drop_sorted)
        logits = mx.where(drop, -mx.inf, logits)
    return mx.random.categorical(logits, key=position_key(params.seed, position))
