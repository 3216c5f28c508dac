"""Two builds' per-hop overhead, side by side: request by request, on the same machine at the same time.

    python benchmarks/ab_hop.py --a ../main/.venv/bin/python --b .venv/bin/python [--nodes 3] [--rounds 10]
    python benchmarks/ab_hop.py --a .venv/bin/python --b .venv/bin/python --b-args="--secret s3cr3t..."

Starts one local swarm per interpreter (each runs `swarm.cli` from its own checkout:
loopback, static peers, even split, as swarm-bench does), then alternates: a batch of
greedy streams on A, the same on B, then B, A, ... (A first in odd rounds, B in even ones,
unless --no-alternate). After each batch it reads the entry's
own per-step measurement (/health decode_timing: step wall time minus the stages'
compute, per hop, median over the batch's steps). Alternating batches within one
run keeps the machine's drift (other processes, the hour) out of the ratio, which
separate swarm-bench runs on a shared machine cannot. Prints each round and the
medians; `B/A` below 1 means B's hops are cheaper.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.bench.client import stream_completion  # noqa: E402
from swarm.bench.cluster import LocalCluster, get_json  # noqa: E402
from swarm.bench.prompts import PROMPT  # noqa: E402

STEPS_PER_BATCH = 300  # more than the entry's window of 256 steps: a reading sees only its own batch


def started(python: str, nodes: int, workdir: Path, model: str | None, extra_args: str = "") -> LocalCluster:
    workdir.mkdir(parents=True)
    # The nodes run that build's code: its interpreter, and a working directory that is no
    # checkout (`python -m` would import the package from there first).
    cluster = LocalCluster(nodes, workdir, model, extra_args=tuple(shlex.split(extra_args)), python=python)
    with _cwd(workdir):
        return cluster.__enter__()


@contextlib.contextmanager
def _cwd(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def batch(cluster: LocalCluster, tokens: int) -> dict:
    for _ in range(-(-STEPS_PER_BATCH // (tokens - 1))):
        stream_completion(cluster.entry.url, PROMPT, tokens)
    return get_json(cluster.entry.url + "/health")[1]["decode_timing"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="python of build A (its checkout's venv)")
    p.add_argument("--b", required=True, help="python of build B")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--model", default=None)
    p.add_argument("--a-args", default="", help="extra swarm-node arguments for A's nodes (one string)")
    p.add_argument("--b-args", default="", help="extra swarm-node arguments for B's nodes, e.g. --secret ...")
    p.add_argument("--alternate", action=argparse.BooleanOptionalAction, default=True,
                   help="B's batch first in every other round (default): whichever runs second in a round "
                        "read up to ~0.02 ms/hop cheaper (docs/performance.md), so a fixed order biases B - A")
    args = p.parse_args()
    # A kill (SIGTERM) unwinds like Ctrl-C, so both swarms' nodes are stopped, not left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load_before = os.getloadavg()[0]  # a shared machine: say how busy it was
    with tempfile.TemporaryDirectory(prefix="ab-hop-") as tmp:
        a = started(args.a, args.nodes, Path(tmp) / "a", args.model, args.a_args)
        try:
            b = started(args.b, args.nodes, Path(tmp) / "b", args.model, args.b_args)
            try:
                for c in (a, b):  # warm up: connections made, code paths run once
                    stream_completion(c.entry.url, PROMPT, 8)
                rows = []
                print(f"{'round':>5} {'first':>5} {'A ms/hop':>9} {'B ms/hop':>9} {'B/A':>6} {'A step':>8} {'B step':>8}")
                for r in range(args.rounds):
                    b_first = args.alternate and r % 2 == 1
                    if b_first:
                        tb = batch(b, args.tokens)
                        ta = batch(a, args.tokens)
                    else:
                        ta, tb = batch(a, args.tokens), batch(b, args.tokens)
                    ha, hb = ta["overhead_per_hop_ms"], tb["overhead_per_hop_ms"]
                    rows.append((ha, hb, ta["step_ms"], tb["step_ms"], b_first))
                    print(f"{r + 1:>5} {'B' if b_first else 'A':>5} {ha:9.3f} {hb:9.3f} {hb / ha:6.2f} "
                          f"{ta['step_ms']:8.1f} {tb['step_ms']:8.1f}", flush=True)
            finally:
                b.stop()
        finally:
            a.stop()
    med = [statistics.median(col) for col in list(zip(*rows))[:4]]
    ratios = statistics.median(hb / ha for ha, hb, *_ in rows)
    diffs = sorted(hb - ha for ha, hb, *_ in rows)
    print(f"median: A {med[0]:.3f} ms/hop, B {med[1]:.3f} ms/hop, B/A {ratios:.2f} (median of rounds); "
          f"decode step A {med[2]:.1f} ms, B {med[3]:.1f} ms")
    print(f"B - A per hop: median of rounds {statistics.median(diffs):+.3f} ms, rounds from {diffs[0]:+.3f} to "
          f"{diffs[-1]:+.3f} ms (middle half {diffs[len(diffs) // 4]:+.3f} to {diffs[(3 * len(diffs)) // 4]:+.3f}); "
          f"1-min load {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    if args.alternate and len(rows) > 1:  # the order's own effect: the build that runs second tends to read cheaper
        by_order = [statistics.median(hb - ha for ha, hb, *_, bf in rows if bf == first) for first in (False, True)]
        print(f"B - A by order: A first {by_order[0]:+.3f} ms, B first {by_order[1]:+.3f} ms; "
              f"their mean {(by_order[0] + by_order[1]) / 2:+.3f} ms (the order's effect cancelled)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
