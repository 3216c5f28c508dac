"""The layers this node holds for the current plan, reloaded only where they change.

`assign` runs on the event loop (planning calls it) and loads on the MLX thread; the
stage service reads `stage` and `plan` on the MLX thread. `plan` is None while the
layers change, so no message is served by layers of another plan.
"""

from __future__ import annotations

import logging

import mlx.core as mx

from partitioner import Plan

from ..engine.constraints import GrammarVocab
from ..engine.shard import load_shard
from ..engine.shard_runner import ShardRunner
from ..engine.worker import MlxWorker

log = logging.getLogger(__name__)


class StageHost:
    def __init__(self, model_dir, dtype: mx.Dtype | None, worker: MlxWorker, dequantize: bool = False,
                 vocab: GrammarVocab | None = None):
        self.model_dir, self.dtype, self.worker = model_dir, dtype, worker
        self.vocab = vocab  # grammars for the requests we sample (when we hold the last layers)
        self.dequantize = dequantize  # quantized layers loaded as `dtype` floats
        self.stage: ShardRunner | None = None
        self.plan: Plan | None = None  # the plan `stage` serves; None while loading

    @property
    def plan_id(self) -> str | None:
        return self.plan.plan_id if self.plan else None

    def stage_index(self) -> int | None:
        if self.plan is None or self.stage is None:
            return None
        for i, s in enumerate(self.plan.stages):
            if s.start == self.stage.range.start:
                return i
        return None

    async def assign(self, plan: Plan | None, layers: tuple[int, int] | None) -> None:
        """Serve `layers` of `plan` (None: no layers). Keeps layers it already holds."""
        self.plan = None  # frames for the old plan are refused from now on
        if layers is None:
            self.stage = None  # its memory is freed with the last reference
        elif self.stage is None or (self.stage.range.start, self.stage.range.end) != layers:
            old = self.stage.shard if self.stage else None
            self.stage = None
            shard = await self.worker.run(load_shard, self.model_dir, layers[0], layers[1], self.dtype, old,
                                          self.dequantize)
            del old
            self.stage = ShardRunner(shard, self.vocab)
            log.info("now holding layers [%d, %d): %.1f MB", *layers, shard.weight_bytes() / 1e6)
        self.plan = plan

    @property
    def weight_bytes(self) -> int:
        return self.stage.shard.weight_bytes() if self.stage else 0
