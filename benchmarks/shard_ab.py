"""Today's shard (the model's own forward) against the old re-written block loop, one process.

    python benchmarks/shard_ab.py [--model DIR] [--tokens 32] [--rounds 5]

The old shard is kept verbatim as a bench-only baseline (benchmarks/baseline/old_shard.py).
On the default model (SmolLM2-135M, a llama: a family both shards run exactly),
each round decodes `--tokens` greedy tokens after a 128-token prompt with the
whole model in one shard and with the 3-stage split 0-10 / 10-20 / 20-30
chained in this process, old and new in alternating order. Prints median ms
per decode step and the ratio new / old (below 1.00: the new shard is faster),
and checks that both produce the same tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT / "baseline"))

import old_shard  # noqa: E402

from swarm.engine.blas import blas_in_use  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402

PROMPT = [(i * 131) % 350 + 3 for i in range(128)]  # ids valid in any vocabulary


def _old_chain(path, bounds):
    shards = [old_shard.load_shard(path, a, b, mx.float32) for a, b in zip(bounds, bounds[1:])]
    return shards, lambda: [s.make_caches() for s in shards], lambda cs: [[c.state for c in x] for x in cs]


def _new_chain(path, bounds):
    shards = [load_shard(path, a, b, mx.float32) for a, b in zip(bounds, bounds[1:])]
    return shards, lambda: [s.make_caches() for s in shards], lambda cs: [c.arrays() for c in cs]


def decode(chain, tokens: int) -> tuple[float, list[int]]:
    shards, make, arrays = chain
    caches = make()

    def run(x):
        for s, c in zip(shards, caches):
            x = s(x, c)
            mx.eval(x, arrays([c]))
        return x
    token = int(mx.argmax(run(mx.array([PROMPT]))))
    out, steps = [token], []
    for _ in range(tokens):
        t0 = time.perf_counter()
        token = int(mx.argmax(run(mx.array([[token]]))))
        steps.append(time.perf_counter() - t0)
        out.append(token)
    return statistics.median(steps), out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    path = args.model or resolve_model(None).path
    n = json.loads((Path(path) / "config.json").read_text())["num_hidden_layers"]
    setups = {"1 stage": [0, n], "3 stages": [0, n // 3, 2 * n // 3, n]}
    chains = {(name, kind): (_old_chain if kind == "old" else _new_chain)(path, bounds)
              for name, bounds in setups.items() for kind in ("old", "new")}
    results: dict = {key: [] for key in chains}
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for name in setups:
            for kind in order:
                results[(name, kind)].append(decode(chains[(name, kind)], args.tokens))
                print(f"  {name} {kind}: {results[(name, kind)][-1][0] * 1e3:.1f} ms/step", file=sys.stderr,
                      flush=True)
    print(f"\nBLAS: {blas_in_use()}; median ms per decode step over {args.tokens} tokens after a "
          f"{len(PROMPT)}-token prompt, median of {args.rounds} alternating rounds\n")
    print("| setup | old shard ms/step | new shard ms/step | new / old | same tokens |")
    print("|---|---:|---:|---:|---|")
    for name in setups:
        old = statistics.median(x[0] for x in results[(name, "old")])
        new = statistics.median(x[0] for x in results[(name, "new")])
        same = all(a[1] == b[1] for a, b in zip(results[(name, "old")], results[(name, "new")]))
        print(f"| {name} | {old * 1e3:.2f} | {new * 1e3:.2f} | {new / old:.3f} | {'yes' if same else 'no'} |")


if __name__ == "__main__":
    main()
