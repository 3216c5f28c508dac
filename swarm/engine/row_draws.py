"""The tokens a last stage draws for the rows of one batched decode pass (ShardRunner.decode_batch).

Built on the pass's lazy logits so they join its one evaluation: a row's own eval would be a sync
apiece, which adds up over a batch. A greedy row is an argmax (what sample() gives at temperature 0),
a sampled row its own draw, a row with decoding rules its request's sampler (request_sampler.py).
"""

from __future__ import annotations

import mlx.core as mx

from .batch_rows import DecodeStep
from .request_sampler import RequestSampler
from .sampling import sampled
from .token_logprobs import SampledToken


class RowDraws:
    def __init__(self, out: mx.array, steps: list[DecodeStep], samplers: list[RequestSampler | None]):
        """`out`: the pass's logits (B, vocab), row j of `steps`' step (its sampling None: nothing to draw)."""
        self.steps, self.samplers = steps, samplers
        self.prepared = [sampler.prepare(out[j]) if sampler is not None and step.sampling is not None else None
                         for j, (step, sampler) in enumerate(zip(steps, samplers))]
        plain = [j for j, step in enumerate(steps) if self.prepared[j] is None and step.sampling is not None]
        self.greedy = [j for j in plain if steps[j].sampling.greedy]
        self.argmaxes = mx.argmax(out[mx.array(self.greedy)], axis=-1) if self.greedy else mx.array([])
        self.drawn = {j: sampled(out[j], steps[j].sampling, steps[j].pos + 1) for j in plain
                      if not steps[j].sampling.greedy}
        self._picked: dict[int, int] | None = None

    def arrays(self) -> list:
        """What to evaluate with the pass."""
        return [[p.arrays() for p in self.prepared if p is not None], self.argmaxes, list(self.drawn.values())]

    def token(self, j: int) -> int | SampledToken | None:
        """Row j's token, once the pass was evaluated (None: it samples nothing)."""
        if self._picked is None:
            self._picked = dict(zip(self.greedy, self.argmaxes.tolist()))
        step = self.steps[j]
        if j in self._picked:
            return self._picked[j]
        if j in self.drawn:
            return self.drawn[j].item()
        if step.sampling is not None:
            return self.samplers[j].draw(self.prepared[j], step.sampling, step.pos + 1)
        return None
