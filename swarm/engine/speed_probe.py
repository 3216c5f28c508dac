"""Measure this machine's speed on the real engine: seconds per layer per token.

A short decode benchmark on two of the model's own layers, cached per machine, model and dtype so
that a restart soon after does not pay for it again; a cached speed older than CACHE_TTL_S is
measured again (the machine may be busier or idler now). Once the node serves, its speed follows
its real passes (node/speed_follower.py), which also runs a `SpeedProbe` now and then while idle.
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
CACHE_TTL_S = 3600.0


class SpeedProbe:
    """Two of the model's layers, loaded once, timed on demand (MLX thread)."""

    def __init__(self, model_dir: Path, n_layers: int, dtype: mx.Dtype | None, dequantize: bool = False,
                 outlined: Outline | None = None) -> None:
        self.start = max(0, min(n_layers // 2, n_layers - PROBE_LAYERS))
        self.end = min(n_layers, self.start + PROBE_LAYERS)
        self.shard = load_shard(model_dir, self.start, self.end, dtype, dequantize_layers=dequantize,
                                outlined=outlined)

    def __call__(self) -> float:
        """Seconds per layer per decoded token, now."""
        shard = self.shard
        caches = shard.make_caches()
        x = shard.example_input(CONTEXT)
        mx.eval(shard(x, caches), caches.arrays())
        step = x[:, :1]
        mx.eval(shard(step, caches), caches.arrays())  # warm-up
        t0 = time.perf_counter()
        for _ in range(STEPS):
            mx.eval(shard(step, caches), caches.arrays())
        return (time.perf_counter() - t0) / STEPS / (self.end - self.start)


def measure_speed(model_dir: Path, n_layers: int, dtype: mx.Dtype | None, dequantize: bool = False,
                  outlined: Outline | None = None) -> float:
    """Seconds per layer per decoded token (call on the MLX thread); `outlined`: see load_shard."""
    return SpeedProbe(model_dir, n_layers, dtype, dequantize, outlined)()


def cached_speed(state_dir: Path, key: str, measure, now: float | None = None) -> float:
    """The measured speed for `key`, measuring (and saving) when unknown or older than CACHE_TTL_S."""
    now = time.time() if now is None else now
    path = Path(state_dir) / "speed.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    entry = known.get(key)
    if (isinstance(entry, dict) and isinstance(entry.get("s"), (int, float)) and entry["s"] > 0
            and isinstance(entry.get("at"), (int, float)) and 0 <= now - entry["at"] < CACHE_TTL_S):
        return float(entry["s"])
    speed = measure()
    known[key] = {"s": speed, "at": now}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(known, indent=1))
    tmp.replace(path)
    log.info("measured speed %.3f ms per layer per token (%s)", speed * 1e3, key)
    return speed
