"""The layers this node holds for the current plan, reloaded only where they change.

`assign` runs on the event loop (planning calls it) and loads on the MLX thread; the
stage service reads `stage` and `plan` on the MLX thread. `plan` is None while the
layers change, so no message is served by layers of another plan.

It also remembers the last few plans it was given (`known_plan`, from the moment it is given
one, before loading): who may send a frame for a plan is decided by that plan's stages
(node/sender_rules.py), also for the plan just left behind, whose late frames still get an
answer.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Sequence

import mlx.core as mx

from partitioner import Plan

from ..backend import this_backend
from ..engine.cache_budget import CacheLimits
from ..engine.constraints import GrammarVocab
from ..engine.model_bytes import LayerCache
from ..engine.kernel_warmup import mlx_warm_up
from ..engine.model_outline import Outline
from ..engine.shard import load_shard
from ..engine.prompt_cache import PromptCacheSize
from ..engine.shard_runner import ShardRunner
from ..engine.worker import MlxWorker

log = logging.getLogger(__name__)

KNOWN_PLANS = 8


class StageHost:
    def __init__(self, model_dir, dtype: mx.Dtype | None, worker: MlxWorker, dequantize: bool = False, *,
                 context: int | None = None, layer_caches: Sequence[LayerCache] = (),
                 vocab: GrammarVocab | None = None, outlined: Outline | None = None,
                 prompt_cache: PromptCacheSize | None = None):
        """`context`: the model's positions; `layer_caches`: each layer's cache bytes (engine/model_bytes.py),
        from which the caps on what requests may hold here are set (engine/cache_budget.py); `outlined`:
        the model's outline (engine/shard.py, check_splittable), else each load outlines it; `prompt_cache`:
        how many bytes the stage keeps for finished requests (engine/prompt_cache.py)."""
        self.model_dir, self.dtype, self.worker, self.outlined = model_dir, dtype, worker, outlined
        self.vocab = vocab  # grammars for the requests we sample (when we hold the last layers)
        self.dequantize = dequantize  # quantized layers loaded as `dtype` floats
        self.context, self.layer_caches = context, tuple(layer_caches)
        self.prompt_cache = prompt_cache or PromptCacheSize(0)
        self.runner: ShardRunner | None = None
        self.plan: Plan | None = None  # the plan `runner` serves; None while loading
        self._known: OrderedDict[str, Plan] = OrderedDict()  # written on the event loop, read on the MLX thread

    def known_plan(self, plan_id: str) -> Plan | None:
        """One of the last plans this node was given (one dict read: any thread)."""
        return self._known.get(plan_id)

    def _remember(self, plan: Plan) -> None:
        self._known[plan.plan_id] = plan
        self._known.move_to_end(plan.plan_id)
        while len(self._known) > KNOWN_PLANS:
            self._known.popitem(last=False)

    @property
    def plan_id(self) -> str | None:
        return self.plan.plan_id if self.plan else None

    def stage_index(self) -> int | None:
        if self.plan is None or self.runner is None:
            return None
        for i, s in enumerate(self.plan.stages):
            if s.start == self.runner.range.start:
                return i
        return None

    async def assign(self, plan: Plan | None, layers: tuple[int, int] | None) -> None:
        """Serve `layers` of `plan` (None: no layers). Keeps layers it already holds."""
        self.plan = None  # frames for the old plan are refused from now on
        if plan is not None:
            self._remember(plan)
        if layers is None:
            self.runner = None  # its memory is freed with the last reference
        elif self.runner is None or (self.runner.range.start, self.runner.range.end) != layers:
            old = self.runner.shard if self.runner else None
            self.runner = None
            shard = await self.worker.run(load_shard, self.model_dir, layers[0], layers[1], self.dtype, old,
                                          self.dequantize, self.outlined)
            del old
            await self.worker.run(mlx_warm_up, shard, this_backend().warm_batch_widths)
            self.runner = ShardRunner(shard, self._limits(*layers), self.context, self.vocab,
                                      prompt_cache_bytes=self.prompt_cache.for_layers(
                                          shard.weight_bytes(), self.layer_caches[layers[0]:layers[1]]),
                                      decode_ahead=this_backend().decode_ahead)
            log.info("now holding layers [%d, %d): %.1f MB", *layers, shard.weight_bytes() / 1e6)
        self.plan = plan

    def _limits(self, start: int, end: int) -> CacheLimits | None:
        if not self.layer_caches or self.context is None:
            return None  # counted, not capped by bytes (tests that build a host by hand)
        return CacheLimits.for_layers(self.layer_caches, start, end, self.context)

    @property
    def weight_bytes(self) -> int:
        return self.runner.shard.weight_bytes() if self.runner else 0
