"""What a decode step that checks k drafts costs against a step of one position, on one node holding the whole
model: the price of each speculative pass, which accepted drafts must pay for (entry/speculation.py).

    python benchmarks/verify_pass_cost.py [--model DIR|GGUF] [--steps 24] [--ks 1,2,4,8] [--dtype auto]

Runs ShardRunner.forward as a stage does: a step of one token (sampled at one position), and steps of the
last token plus k drafts (sampled at k + 1 positions; the drafts are wrong, so each next step trims them
back: the trim is in the cost). Prints median wall milliseconds per pass and the ratio to a pass of one,
side by side in one run. Run it under the BLAS a node uses (engine/blas.py: LD_PRELOAD it on a CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_tokenizer

from swarm.bench.prompts import PROMPT
from swarm.backend import this_backend
from swarm.engine.blas import blas_in_use
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.models.resolve import resolve_model

GREEDY = SamplingParams(temperature=0.0)


def pass_ms(runner: ShardRunner, prompt: list[int], k: int, steps: int, rid: str) -> float:
    runner.forward(rid, mx.array([prompt[:-1]]), 0)
    pos, token, times = len(prompt) - 1, prompt[-1], []
    for _ in range(steps):
        ids = [token] + [(token + 1 + j) % 1000 for j in range(k)]  # drafts that will not be accepted
        t0 = time.perf_counter()
        out = runner.forward(rid, mx.array([ids]), pos, GREEDY, ids=ids)
        times.append(time.perf_counter() - t0)
        token = out[0] if isinstance(out, list) else int(out)
        pos += 1
    runner.release(rid)
    return statistics.median(times[2:]) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="mlx-lm model dir or .gguf (default: the built-in SmolLM2-135M)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--ks", default="1,2,4,8")
    p.add_argument("--dtype", default="auto", choices=["auto", "native", "float32", "float16", "bfloat16"])
    args = p.parse_args()
    backend = this_backend()
    model_dir = resolve_model(args.model, backend=backend.kind).path
    prompt = list(load_tokenizer(Path(model_dir)).encode(PROMPT))
    runner = ShardRunner(load_shard(Path(model_dir), 0, None, dtype=backend.weights_dtype(args.dtype)))
    one = pass_ms(runner, prompt, 0, args.steps, "warm")
    one = pass_ms(runner, prompt, 0, args.steps, "one")
    rows = [(0, one)] + [(k, pass_ms(runner, prompt, k, args.steps, f"k{k}")) for k in map(int, args.ks.split(","))]
    print(f"backend {backend.describe()}, BLAS {blas_in_use()}, mlx {mx.__version__}, model {model_dir.name}, "
          f"prompt {len(prompt)} tokens, median of {args.steps} passes\n")
    print("| drafts k | positions a pass | ms a pass | x a pass of one |\n|---:|---:|---:|---:|")
    for k, ms in rows:
        print(f"| {k} | {k + 1} | {ms:.1f} | {ms / one:.2f} |")


if __name__ == "__main__":
    main()
