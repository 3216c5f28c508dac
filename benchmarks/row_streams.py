"""A batched prompt pass whole against cut by rows across CPU streams (engine/row_streams.py), side by side.

    python benchmarks/row_streams.py [--model DIR] [--rows 8] [--prompt 189] [--rounds 4]

B prompts of the same length prefilled by one stage holding the whole model (float32, with the
optimized BLAS preloaded, as a node runs it), ShardRunner.prefill_batch with the pass whole and
with it cut, alternating round by round; then where a whole pass's layer goes (its matmuls, the
MLP's SiLU, attention), to show what one thread was doing alone. Checks the outputs are equal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.engine import blas  # noqa: E402  (imports no mlx)

if __name__ == "__main__" and not os.environ.get("SWARM_BLAS_ACTIVE") and blas.find_optimized_blas():
    os.execve(sys.executable, [sys.executable, *sys.argv], blas.reexec_env(blas.find_optimized_blas(), dict(os.environ)))

import mlx.core as mx  # noqa: E402
from mlx_lm.models.activations import swiglu  # noqa: E402

from swarm.engine import row_streams  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402


def timed(fn, n: int = 5) -> float:
    mx.eval(fn())
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=189, help="positions per row")
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    model = resolve_model(args.model, backend="cpu")
    shard = load_shard(model.path, 0, None, mx.float32)
    groups = row_streams.row_groups(args.rows)
    x = mx.array([[5 + (7 * r + i) % 1000 for i in range(args.prompt)] for r in range(args.rows)])
    cut = row_streams.row_groups
    ways = {"whole": lambda rows: [], "cut": cut}

    def prefill(way: str):
        row_streams.row_groups = ways[way]
        try:
            out, batch = shard.prefill_batch(x, [0] * args.rows)
            mx.eval(out, [(c.keys, c.values) for c in batch])
            return out
        finally:
            row_streams.row_groups = cut
    print(f"{model.model_id}, float32, BLAS {blas.blas_in_use()}: {args.rows} prompts of {args.prompt} positions, "
          f"cut into {groups or 'nothing (not on this machine)'}")
    equal = mx.array_equal(prefill("whole"), prefill("cut")).item()
    print(f"outputs equal bit for bit: {equal}")
    print("| round | whole ms | cut ms | cut / whole |")
    print("|---:|---:|---:|---:|")
    for r in range(args.rounds):
        took = {}
        for way in (("whole", "cut") if r % 2 == 0 else ("cut", "whole")):
            t0 = time.perf_counter()
            prefill(way)
            took[way] = 1e3 * (time.perf_counter() - t0)
        print(f"| {r} | {took['whole']:.0f} | {took['cut']:.0f} | {took['cut'] / took['whole']:.2f} |", flush=True)
    layer = shard.model.model.layers[len(shard.model.model.layers) // 2]
    h = mx.random.normal((args.rows, args.prompt, shard.hidden_size))
    gate = layer.mlp.gate_proj(h)
    mx.eval(h, gate)
    print(f"\none layer of the whole pass, ms (median of 5): the layer {timed(lambda: layer(h, 'causal', None)):.1f}, "
          f"its attention {timed(lambda: layer.self_attn(h, 'causal', None)):.1f}, its MLP {timed(lambda: layer.mlp(h)):.1f}, "
          f"of which the SiLU alone (one thread) {timed(lambda: swiglu(gate, gate)):.1f} and one of its three matmuls "
          f"{timed(lambda: layer.mlp.gate_proj(h)):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
