"""What a verifying pass costs: one step carrying the last token and k drafts against a step of one position.

    python benchmarks/verify_pass_cost.py [--model DIR] [--drafts 1,2,4,8] [--steps 12] [--rounds 3] [--context 128]

The whole model on one shard (float32, one node), as a stage runs it (ShardRunner.forward): a step of one
position, then steps of k + 1 positions whose last stage draws at every position (engine/draft_check.py),
all at the same position after a prompt of --context tokens (each step's unaccepted positions are cut off
by the next, as on a stage). Wall time per step (the token read back included), median over steps and
steps of every size in turn. The ratio to one position is what the step must bring back in tokens to break even:
a step with k drafts pays off when more than (ratio - 1) of them are accepted on average.

Re-executes itself with the optimized BLAS a node would preload (engine/blas.py), with a node's BLAS threads
(OpenBLAS's default, all cores; set OPENBLAS_NUM_THREADS to compare): the curve depends on them. On a 2-core
CPU with one thread a pass of 4 positions cost what one of 1 did and one of 3 1.29x (a kernel's tiling); with
the two a node runs, cost grows with every position (1.19x, 1.37x, 1.56x for 2, 3, 4).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.engine.blas import blas_to_preload, reexec_env  # noqa: E402


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="an mlx-lm model dir (default: SmolLM2-135M float32)")
    p.add_argument("--drafts", default="1,2,4,8")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--context", type=int, default=128)
    args = p.parse_args(argv)

    import mlx.core as mx
    from swarm.engine.blas import blas_in_use
    from swarm.engine.sampling import SamplingParams
    from swarm.engine.shard import load_shard
    from swarm.engine.shard_runner import ShardRunner
    from swarm.models.resolve import resolve_model

    greedy = SamplingParams(temperature=0.0)
    shard = load_shard(args.model or resolve_model(None).path, 0, None, mx.float32)
    runner = ShardRunner(shard)
    prompt = [(i * 31) % 350 + 3 for i in range(args.context)]
    runner.forward("r", mx.array([prompt[:-1]]), 0)
    at, token = len(prompt) - 1, prompt[-1]
    state = runner._requests[("", "r")]
    ks = [0] + [int(k) for k in args.drafts.split(",")]
    times: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(args.rounds * args.steps):
        for k in ks:  # (each size in turn, step by step: a shared machine's load changes slowly)
            drafts = [(token + 7 * i + 1) % 350 + 3 for i in range(k)] or None
            t0 = time.perf_counter()
            runner.forward("r", mx.array([[token, *(drafts or [])]]), at, greedy, drafts=drafts)
            times[k].append(time.perf_counter() - t0)
            state.drafted = k + 1  # (the next step starts at `at` again: every position of this one goes)
    one = statistics.median(times[0])
    print(f"\n{shard.family}, float32, BLAS: {blas_in_use()}, {args.context} positions of context; median wall "
          f"ms per step over {args.steps * args.rounds} steps of each size, taken in turn\n")
    print("| positions per pass | drafts | ms per pass | vs one position |")
    print("|---:|---:|---:|---:|")
    for k in ks:
        ms = statistics.median(times[k])
        print(f"| {k + 1} | {k} | {ms * 1e3:.1f} | {ms / one:.2f}x |")


if __name__ == "__main__":
    blas = blas_to_preload(dict(os.environ))
    if blas is not None:
        env = reexec_env(blas, dict(os.environ))
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], env)
    main(sys.argv[1:])
