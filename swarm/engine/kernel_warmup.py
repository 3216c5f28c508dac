"""Run a shard's passes once at each usual batch width before any request does.

MLX's CUDA backend compiles a kernel on its first use for each shape it meets (a fused element-wise
graph, a matmul's configuration): the first burst of 8 streams would pay that inside its requests'
steps. A stage that has loaded its layers runs, for each width, a short padded prompt pass on a batch
cache and one decode step of it kept (the passes kept batches run), and one lone decode step, so the
kernels are ready. Nothing is kept; on a CPU nothing is compiled this way and none of it runs
(Backend.warm_batch_widths is empty there).
"""

from __future__ import annotations

import logging
import time

import mlx.core as mx

from .shard import Shard

log = logging.getLogger(__name__)

PROMPT_POSITIONS = 8  # a short prompt: its pass compiles the prompt kernels of its width


def mlx_warm_up(shard: Shard, widths: tuple[int, ...]) -> None:
    """Run the passes a stage runs at each of `widths` once (MLX thread; nothing is kept)."""
    if not widths:
        return
    started = time.monotonic()
    caches = shard.make_caches()
    mx.eval(shard(shard.example_input(PROMPT_POSITIONS), caches), caches.arrays())
    mx.eval(shard(shard.example_input(1), caches), caches.arrays())
    if shard.takes_padded_batches:
        for width in widths:
            if width < 2:
                continue
            x = mx.concatenate([shard.example_input(PROMPT_POSITIONS)] * width, axis=0)
            out, batch = shard.prefill_batch(x, [0] * width)
            mx.eval(out, [(c.keys, c.values) for c in batch])
            step = mx.concatenate([shard.example_input(1)] * width, axis=0)
            mx.eval(shard.decode_kept(step, batch))
    log.info("kernels for batch widths %s ready in %.1f s", ",".join(map(str, widths)), time.monotonic() - started)
