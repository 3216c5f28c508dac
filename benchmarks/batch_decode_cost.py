"""What batched decode costs, per design: prints a table for the next engineer to choose from.

    python benchmarks/batch_decode_cost.py [--model DIR] [--rows 1,2,4] [--steps 16] [--rounds 3] [--ways all]

One decode step of B requests whose contexts differ (64, 96, 128, ... positions),
on one shard of the whole model (float32), four ways:

- one by one: each request through the model's own forward (what every family
  not proven for the unrolled pass gets with --batch-decode; exact by construction);
- unrolled: the engine's unrolled pass on each request's own caches (llama / qwen2 /
  qwen3 only; attention projections, MLP and head once for all rows; what a stage runs
  when a kept batch would pass a cap);
- kept (stage): what a stage runs by default, ShardRunner.decode_batch on a batch it
  keeps across steps (engine/kept_batches.py: mlx-lm's BatchKVCache, the model's own
  forward), with its bookkeeping (row order, budget);
- batch caches, merged per step: mlx-lm's BatchKVCache built from the requests'
  own caches before the step (`KVCache.merge`), the model's own forward on (B, 1)
  with its left-padding mask, each row's cache extracted after (`extract`): works
  for every family with mlx-lm batch caches, and the requests of a step may
  change from step to step, as they do on a stage;
- batch caches, kept: the same forward on a BatchKVCache that lives across steps
  (what mlx-lm's BatchGenerator does): no merge and extract, but the batch's
  membership is then fixed between re-merges.

"same" says whether the greedy tokens equal one-by-one's over all steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.engine.blas import blas_in_use  # noqa: E402
from swarm.engine.sampling import SamplingParams  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402
from swarm.engine.shard_runner import ShardRunner  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402


GREEDY = SamplingParams(temperature=0.0)


def prompts(rows: int) -> list[list[int]]:
    return [[(i * 31 + r * 7) % 350 + 3 for i in range(64 + 32 * r)] for r in range(rows)]  # any vocab


def per_row(runner: ShardRunner, rows: int, steps: int, batched: bool) -> tuple[float, list]:
    """One by one (forward) or runner.decode_batch (unrolled or kept, as the runner is set)."""
    ps = prompts(rows)
    tokens = [int(mx.argmax(runner.forward(f"r{r}", mx.array([p]), 0))) for r, p in enumerate(ps)]
    seen, times = [], []
    for s in range(steps):
        items = [(f"r{r}", mx.array([[t]]), len(ps[r]) + s, GREEDY) for r, t in enumerate(tokens)]
        t0 = time.perf_counter()
        if batched:
            outs = runner.decode_batch(items)
        else:
            outs = [runner.forward(*item) for item in items]
        tokens = [int(o) for o in outs]
        times.append(time.perf_counter() - t0)
        seen.append(tokens)
    for r in range(rows):
        runner.release(f"r{r}")
    return statistics.median(times), seen


def batch_caches(model, rows: int, steps: int, keep: bool) -> tuple[float, list]:
    ps = prompts(rows)
    caches, tokens = [], []
    for p in ps:
        c = make_prompt_cache(model)
        logits = model(mx.array([p]), cache=c)[0, -1]
        mx.eval(logits, [x.state for x in c])
        caches.append(c)
        tokens.append(int(mx.argmax(logits)))
    n_layers = len(caches[0])
    kept = [BatchKVCache.merge([c[i] for c in caches]) for i in range(n_layers)] if keep else None
    seen, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = kept or [BatchKVCache.merge([c[i] for c in caches]) for i in range(n_layers)]
        logits = model(mx.array([[t] for t in tokens]), cache=batch)[:, -1]
        if not keep:
            caches = [[batch[i].extract(r) for i in range(n_layers)] for r in range(rows)]
        mx.eval(logits, [b.state for b in batch], [[x.state for x in c] for c in caches])
        tokens = [int(t) for t in mx.argmax(logits, axis=-1).tolist()]
        times.append(time.perf_counter() - t0)
        seen.append(tokens)
    return statistics.median(times), seen


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="an mlx-lm model dir (default: SmolLM2-135M float32)")
    p.add_argument("--rows", default="1,2,4")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ways", default="all", help="comma-separated numbers of the ways to run, 1-5 (in the order "
                                                  "above; 1, one by one, always runs: the reference)")
    args = p.parse_args(argv)
    path = args.model or resolve_model(None).path
    shard = load_shard(path, 0, None, mx.float32)
    if shard.unrolled is None:
        sys.exit(f"{shard.family} has no unrolled pass; give a llama / qwen2 / qwen3 model")
    runner = ShardRunner(shard, keep_batches=False)
    keeping = ShardRunner(shard)
    model = shard.model  # the whole model: its own forward, the shard's hooks only trim the last position
    ways = ["one by one", "unrolled", "kept (stage)", "batch caches, merged per step", "batch caches, kept"]
    if args.ways != "all":
        ways = [w for i, w in enumerate(ways, 1) if i == 1 or str(i) in args.ways.split(",")]
    results: dict[tuple[str, int], list] = {}
    for _ in range(args.rounds):
        for rows in [int(r) for r in args.rows.split(",")]:
            for way in ways:
                if way == "one by one":
                    out = per_row(runner, rows, args.steps, batched=False)
                elif way == "unrolled":
                    out = per_row(runner, rows, args.steps, batched=True)
                elif way == "kept (stage)":
                    out = per_row(keeping, rows, args.steps, batched=True)
                else:
                    out = batch_caches(model, rows, args.steps, keep=way.endswith("kept"))
                results.setdefault((way, rows), []).append(out)
                print(f"  {rows} rows, {way}: {out[0] * 1e3:.1f} ms/step", file=sys.stderr, flush=True)
    print(f"\n{shard.family}, float32, BLAS: {blas_in_use()}; median ms per decode step of all rows over "
          f"{args.steps} steps, median of {args.rounds} alternating rounds\n")
    print("| rows | way | ms per step | tok/s (all rows) | vs one by one | same tokens as one by one |")
    print("|---:|---|---:|---:|---:|---|")
    for rows in [int(r) for r in args.rows.split(",")]:
        base = statistics.median(r[0] for r in results[("one by one", rows)])
        ref = results[("one by one", rows)][0][1]
        for way in ways:
            ms = statistics.median(r[0] for r in results[(way, rows)])
            same = all(r[1] == ref for r in results[(way, rows)])
            print(f"| {rows} | {way} | {ms * 1e3:.1f} | {rows / ms:.1f} | {base / ms:.2f}x | {'yes' if same else 'no'} |")


if __name__ == "__main__":
    main()
