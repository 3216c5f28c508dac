"""Measure this machine's speed on the real engine: seconds per layer per token.

A short decode benchmark on two of the model's own layers, cached per machine,
model and dtype so that restarts do not pay for it again.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import mlx.core as mx

from .model_outline import Outline
from .shard import load_shard

log = logging.getLogger(__name__)

PROBE_LAYERS = 2
CONTEXT = 64
STEPS = 12


def measure_speed(model_dir: Path, n_layers: int, dtype: mx.Dtype | None, dequantize: bool = False,
                  outlined: Outline | None = None) -> float:
    """Seconds per layer per decoded token (call on the MLX thread); `outlined`: see load_shard."""
    start = max(0, min(n_layers // 2, n_layers - PROBE_LAYERS))
    end = min(n_layers, start + PROBE_LAYERS)
    shard = load_shard(model_dir, start, end, dtype, dequantize_layers=dequantize, outlined=outlined)
    caches = shard.make_caches()
    x = shard.example_input(CONTEXT)
    mx.eval(shard(x, caches), caches.arrays())
    step = x[:, :1]
    mx.eval(shard(step, caches), caches.arrays())  # warm-up
    t0 = time.perf_counter()
    for _ in range(STEPS):
        mx.eval(shard(step, caches), caches.arrays())
    return (time.perf_counter() - t0) / STEPS / (end - start)


def cached_speed(state_dir: Path, key: str, measure) -> float:
    """The measured speed for `key`, measuring (and saving) only when unknown."""
    path = Path(state_dir) / "speed.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(key), (int, float)) and known[key] > 0:
        return float(known[key])
    speed = measure()
    known[key] = speed
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(known, indent=1))
    tmp.replace(path)
    log.info("measured speed %.3f ms per layer per token (%s)", speed * 1e3, key)
    return speed
