"""Does a stage compute slower when it idled before its turn? One process, no network.

    python benchmarks/idle_penalty.py [--model DIR] [--stages 3] [--tokens 48] [--idle-ms 0,5,30]

In a K-stage pipeline serving one stream, each stage waits while the others
compute. This runs the same split in one process, back to back, and again with
a sleep before every stage's forward pass, and prints the compute time per
token (sleeps excluded). Where the numbers rise with the gap, the machine itself
(idle CPUs halting and waking cold, as VMs do) makes a pipelined decode slower
than one process, independent of the swarm's transport. swarm-bench's
"decode step ms" column shows the same inflation in real nodes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

from swarm.engine.sampling import SamplingParams  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402
from swarm.engine.shard_runner import ShardRunner  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402

PROMPT = list(range(100, 290))  # 190 ids, about swarm-bench's prompt length


def even_split(n_layers: int, k: int) -> list[tuple[int, int]]:
    bounds = [round(i * n_layers / k) for i in range(k + 1)]
    return list(zip(bounds, bounds[1:]))


def decode(stages: list[ShardRunner], rid: str, tokens: int, idle_s: float) -> list[float]:
    """Prefill, then `tokens` greedy steps; compute seconds per step, sleeps excluded."""
    x = mx.array([PROMPT[:-1]], dtype=mx.int32)
    for s in stages:
        x = s.forward(rid, x, 0, None)
    token, pos, steps = PROMPT[-1], len(PROMPT) - 1, []
    for _ in range(tokens):
        x, spent = mx.array([[token]], dtype=mx.int32), 0.0
        for s in stages:
            if idle_s:
                time.sleep(idle_s)
            t0 = time.perf_counter()
            x = s.forward(rid, x, pos, SamplingParams())
            spent += time.perf_counter() - t0
        token, pos = x, pos + 1
        steps.append(spent)
    for s in stages:
        s.release(rid)
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="mlx-lm model dir or .gguf (default: the built-in model)")
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--idle-ms", default="0,5,30", help="sleep before each stage's forward pass")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians over all steps")
    args = p.parse_args()
    backend = "cpu" if mx.default_device() == mx.cpu else "gpu"
    model = resolve_model(args.model, backend=backend)
    dtype = mx.float32 if backend == "cpu" else None
    splits = {1: [(0, model.n_layers)], args.stages: even_split(model.n_layers, args.stages)}
    stages = {k: [ShardRunner(load_shard(model.path, a, b, dtype)) for a, b in v] for k, v in splits.items()}
    gaps = [float(g) for g in args.idle_ms.split(",")]
    results: dict[tuple[int, float], list[float]] = {}
    for r in range(args.rounds):  # alternate setups so drift in the machine hits all alike
        for k in splits:
            for gap in gaps:
                results.setdefault((k, gap), []).extend(decode(stages[k], f"{k}-{gap}-{r}", args.tokens, gap / 1e3))
    base = statistics.median(results[(1, gaps[0])])
    print(f"{model.model_id}, {model.n_layers} layers, {args.tokens} tokens x {args.rounds} rounds, backend {backend}")
    print(f"{'stages':>6} {'idle before each stage':>24} {'compute ms/token':>18} {'vs 1 stage, no idle':>20}")
    for (k, gap), steps in results.items():
        med = statistics.median(steps)
        print(f"{k:>6} {gap:>21g} ms {med * 1e3:>18.1f} {med / base:>19.2f}x")


if __name__ == "__main__":
    main()
