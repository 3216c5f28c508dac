"""What the first malloc after a forward pass costs, and what turning glibc's fastbins off costs.

    python benchmarks/post_forward_malloc.py [--model DIR] [--layers 10] [--steps 8] [--blocks 12]

A forward pass through MLX builds and frees thousands of small objects. glibc parks
small freed chunks in "fastbins" and merges them (malloc_consolidate) when the
thread next asks for a block of 1 KiB or more. That merge lands on whatever runs
first after the pass: in a node, the hop (benchmarks/hop_profile.py shows it
moving around when the hop code changes). This measures, after each decode step
of one stage, the first 1100-byte allocation and a second one, alternating blocks
of steps with fastbins on (glibc's default) and off (mallopt(M_MXFAST, 0)), in
one process so that both see the same machine. glibc (Linux) only.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

from swarm.engine.shard import load_shard  # noqa: E402
from swarm.engine.shard_runner import ShardRunner  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402

M_MXFAST = 1
DEFAULT_MXFAST = 128  # glibc's default on 64-bit: 64 * sizeof(size_t) / 4


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--layers", type=int, default=10, help="layers of the (middle) stage")
    p.add_argument("--steps", type=int, default=8, help="decode steps per block")
    p.add_argument("--blocks", type=int, default=12, help="blocks, alternating fastbins on/off")
    args = p.parse_args()
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallopt"):
        print("no mallopt here: this is about glibc")
        return 1
    model = resolve_model(args.model)
    start = max(1, (model.n_layers - args.layers) // 2)  # a middle stage: hidden states in, hidden states out
    stage = ShardRunner(load_shard(model.path, start, start + args.layers, mx.float32))
    hidden = mx.random.normal((1, 150, model.config["hidden_size"]))
    stage.forward("r", hidden, 0)
    pos = 150
    results = {True: ([], [], []), False: ([], [], [])}
    for block in range(args.blocks):
        fastbins = block % 2 == 0
        libc.mallopt(M_MXFAST, DEFAULT_MXFAST if fastbins else 0)
        for i in range(args.steps):
            x = mx.random.normal((1, 1, model.config["hidden_size"]))
            mx.eval(x)
            t0 = time.perf_counter()
            stage.forward("r", x, pos)
            t1 = time.perf_counter()
            bytearray(1100)
            t2 = time.perf_counter()
            bytearray(1100)
            t3 = time.perf_counter()
            pos += 1
            if i >= 2:  # the first steps of a block still pay for the switch
                for series, value in zip(results[fastbins], (t1 - t0, t2 - t1, t3 - t2)):
                    series.append(value)
    print(f"{model.model_id}: a {args.layers}-layer stage, float32, decode steps of one request")
    print("| glibc fastbins | forward ms | first 1100 B malloc after it, µs | second one, µs | forward + first ms |")
    print("|---|---:|---:|---:|---:|")
    for fastbins in (True, False):
        fwd, first, second = (statistics.median(s) for s in results[fastbins])
        print(f"| {'on (default)' if fastbins else 'off (M_MXFAST=0)'} | {fwd * 1e3:.2f} | {first * 1e6:.0f} | "
              f"{second * 1e6:.1f} | {(fwd + first) * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
