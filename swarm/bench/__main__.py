"""swarm-bench: start 1..N local nodes on loopback, run fixed greedy prompts, print one table.

    swarm-bench [--model DIR|GGUF] [--nodes 1,2,3] [--tokens 64] [--concurrency 1,2,4] [--dtype auto]
                [--prompts free,edit,typos,names] [--same-prompt] [--speculate off,lookup,draft]
                [--draft-model PATH] [--batch-decode N] [--baseline PYTHON] [--secret] [--skip-mlx-ring]
                [--quick] [--json [PATH]]

Setups on the same model in the same run: mlx-lm alone in this process, the swarm
with each node count (entry = stage 0, even split), and mlx-lm's ring pipeline
(swarm/bench/mlx_ring_pipeline.py) for each node count > 1; one table per kind of prompt.
Every request gets a prompt new to the nodes (their prompt caches would read a repeated one
once); the warm column is a prompt sent again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from .. import environment


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _names(allowed: tuple[str, ...] | None):
    def parse(text: str) -> list[str]:
        values = [x.strip() for x in text.split(",") if x.strip()]
        if not values or len(set(values)) < len(values):
            raise argparse.ArgumentTypeError(f"expected distinct comma-separated names, got {text!r}")
        if allowed is not None and (bad := [v for v in values if v not in allowed]):
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}: choose from {', '.join(allowed)}")
        return values
    return parse


def build_parser() -> argparse.ArgumentParser:
    from .prompts import PROMPTS
    p = argparse.ArgumentParser(prog="swarm-bench", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default=None, help="mlx-lm model dir or .gguf (default: the built-in SmolLM2-135M)")
    p.add_argument("--nodes", type=_ints, default=[1, 2, 3], help="swarm sizes to run (default: 1,2,3)")
    p.add_argument("--tokens", type=int, default=None, help="max_tokens per request (default: 64; --quick: 8)")
    p.add_argument("--concurrency", type=_ints, default=[1, 2, 4], help="simultaneous streams (default: 1,2,4)")
    p.add_argument("--runs", type=int, default=None, help="single-stream repeats, median (default: 3; --quick: 1)")
    p.add_argument("--prompts", type=_names(tuple(PROMPTS)), default=["free"],
                   help="kinds of prompt, a table each: free (text to continue) and the input-grounded edit (a "
                        "60-line function), typos (a paragraph), names (a text's people) (default: free)")
    p.add_argument("--same-prompt", action="store_true",
                   help="send every request the same prompt (the nodes' prompt caches then read it once)")
    p.add_argument("--speculate", type=_names(None), default=None, metavar="MODES",
                   help="a swarm row per mode, its nodes started with --speculate=MODE, e.g. off,lookup "
                        "(default: no such flag)")
    p.add_argument("--draft-model", default=None, metavar="PATH",
                   help="the nodes' --draft-model in --speculate rows of modes that use one (draft, auto)")
    p.add_argument("--skip-mlx-ring", action="store_true", help="do not run mlx-lm's ring pipeline")
    p.add_argument("--quick", action="store_true", help="few tokens and one run (for tests)")
    p.add_argument("--memory-limit", default="2G", help="memory each node offers; equal limits give an even split")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="also dump raw numbers as JSON (to PATH, or stdout after the table)")
    p.add_argument("--batch-decode", type=int, default=0, metavar="N",
                   help="also run each swarm size with `swarm-node --batch-decode N` (one more row per size; "
                        "1 turns batching off)")
    p.add_argument("--baseline", default=None, metavar="PYTHON",
                   help="also run each swarm size with the nodes of another install, e.g. a checkout of main: "
                        "its .venv/bin/python (one more row per size, same run)")
    p.add_argument("--secret", action="store_true",
                   help="also run each swarm size with a swarm secret (proved hellos, sealed frames: one more "
                        "row per size) and print what it costs next to the open swarm of the same run")
    p.add_argument("--dtype", default="auto", choices=["auto", "native", "float32", "float16", "bfloat16"],
                   help="every node's --dtype, and mlx-lm alone's weights to match (auto: float32 on a CPU "
                        "backend, the model's own on a GPU)")
    p.add_argument("--blas", choices=["auto", "off"], default="auto",
                   help="auto: preload the optimized BLAS for this process and every node (same for all setups)")
    p.add_argument("--blas-threads", type=int, default=None, metavar="N",
                   help="OPENBLAS/BLIS/MKL threads in every setup (default: the library's own, as a node runs). "
                        "Several nodes on one small machine spin each other's cores: try 1")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.blas_threads is not None:  # set before the re-exec: this process and every node inherit it
        for var in ("OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.blas_threads)
    if args.blas == "off":
        os.environ[environment.BLAS.name] = "off"
    else:
        # Before mlx loads: this process (mlx-lm alone) and the nodes it starts (which
        # inherit LD_PRELOAD) then all use the same BLAS, so ratios compare like with like.
        from swarm.engine.blas import maybe_reexec_with_blas, release_interrupt
        maybe_reexec_with_blas(argv, module="swarm.bench")
        release_interrupt()  # the re-exec held SIGINT until here: Ctrl-C is a KeyboardInterrupt from now on
    from .run import run_all
    tokens = args.tokens or (8 if args.quick else 64)
    runs = args.runs or (1 if args.quick else 3)
    reports = []
    for k, kind in enumerate(args.prompts):
        with tempfile.TemporaryDirectory(prefix="swarm-bench-") as tmp:
            reports.append(run_all(args.model, args.nodes, tokens, args.concurrency, runs,
                                   not args.skip_mlx_ring and k == 0, args.memory_limit, Path(tmp), args.batch_decode,
                                   args.secret, args.baseline, args.dtype, kind, not args.same_prompt,
                                   args.speculate, args.draft_model))
    print("\n\n".join(r.text for r in reports), flush=True)
    if args.json:
        data = reports[0].data if len(reports) == 1 else {kind: r.data for kind, r in zip(args.prompts, reports)}
        dump = json.dumps(data, indent=2, default=str)
        if args.json == "-":
            print(dump)
        else:
            Path(args.json).write_text(dump + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
