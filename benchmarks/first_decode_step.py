"""A cohort's prompt pass, then its decode steps, on one stage in process: is the first step as fast as the rest?

    python benchmarks/first_decode_step.py [--model DIR] [--rows 8] [--prompt 189] [--steps 8] [--rounds 4]

B prompts prefilled in one padded pass (ShardRunner.prefill_batch, what a stage runs when
new requests' prompts queue together), then B-row greedy decode steps (decode_batch), on the
whole model in float32 with the optimized BLAS, as a node runs it. Prints each round's prefill,
first decode step and the median of the later ones, and where a later step's time goes: the
graph built before the evaluation, the evaluation, and what follows it (sampling).
Showed (stop 27, the default model, 8 rows, the code before and after side by side): the first
step took 141-180 ms against 80-86 for the rest while each row's caches were split out of the
prefill's batch and merged back, 79-113 once the prefill's batch was kept; and 0.85-1.06 ms after
the evaluation for 8 greedy rows sampled one small eval each, 0.10-0.11 once they were taken in
the pass's evaluation (docs/performance.md).
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

import swarm.engine.shard_runner as shard_runner  # noqa: E402
from swarm.engine.sampling import SamplingParams  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402


class _TimedEval:
    """mx with its eval timed, for shard_runner only: [start, end] of each call."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def __getattr__(self, name):
        return getattr(mx, name)

    def eval(self, *arrays) -> None:
        self.marks.append(time.perf_counter())
        mx.eval(*arrays)
        self.marks.append(time.perf_counter())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=189, help="prompt tokens per row")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    model = resolve_model(args.model, backend="cpu")
    stage = shard_runner.ShardRunner(load_shard(model.path, 0, None, mx.float32))
    timed = shard_runner.mx = _TimedEval()
    prompt = mx.array([[5 + i % 100 for i in range(args.prompt)]])
    print(f"{model.model_id}, float32, BLAS {blas.blas_in_use()}: {args.rows} prompts of {args.prompt} tokens, "
          f"then {args.steps} greedy decode steps of {args.rows} rows")
    print("| round | prefill ms | first step ms | later steps ms (median) | of a later step: graph / eval / after, ms |")
    print("|---:|---:|---:|---:|---|")
    for r in range(args.rounds):
        rids = [f"r{r}-{i}" for i in range(args.rows)]
        t0 = time.perf_counter()
        stage.prefill_batch([(rid, prompt) for rid in rids], [""] * args.rows)
        prefill = time.perf_counter() - t0
        steps, parts = [], []
        for k in range(args.steps):
            pos = args.prompt + k
            items = [(rid, mx.array([[7]]), pos, SamplingParams()) for rid in rids]
            timed.marks.clear()
            t0 = time.perf_counter()
            stage.decode_batch(items, [""] * args.rows)
            t1 = time.perf_counter()
            steps.append(t1 - t0)
            start, end = timed.marks[0], timed.marks[-1]
            parts.append((start - t0, end - start, t1 - end))
        for rid in rids:
            stage.release(rid)
        later = parts[1:]
        split = " / ".join(f"{1e3 * statistics.median(x[i] for x in later):.2f}" for i in range(3))
        print(f"| {r} | {1e3 * prefill:.0f} | {1e3 * steps[0]:.0f} | {1e3 * statistics.median(steps[1:]):.1f} | {split} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
