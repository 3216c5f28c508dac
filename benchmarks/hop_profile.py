"""Where a decode step's time goes between stages: a timeline across real nodes.

    python benchmarks/hop_profile.py [--nodes 3] [--tokens 48] [--model DIR|GGUF] [--node-args="--secret ..."]

Starts N nodes on loopback (as swarm-bench does) with SWARM_HOP_TRACE set, streams
one greedy request, and prints the median gap between consecutive events of a
decode step, all at frame boundaries on the data lane: the entry sending the
step, each node's MLX thread receiving the frame and (after its forward pass)
sending the result on, ... until the entry has the token. A gap within one
process is mostly its compute; gaps marked "*" cross from one process to the
next (the socket plus waking the receiver). See swarm/transport/hop_trace.py.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.transport import hop_trace  # noqa: E402
from swarm.bench.client import stream_completion  # noqa: E402
from swarm.bench.cluster import LocalCluster  # noqa: E402
from swarm.bench.prompts import PROMPT  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--model", default=None)
    p.add_argument("--node-args", default="", help="extra swarm-node arguments (one string), e.g. --secret ...")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="swarm-hop-profile-") as tmp:
        trace_dir = Path(tmp) / "trace"
        trace_dir.mkdir()
        os.environ[hop_trace.ENV] = str(trace_dir)  # the nodes inherit it; this process marks nothing
        with LocalCluster(args.nodes, Path(tmp), args.model, extra_args=tuple(shlex.split(args.node_args))) as cluster:
            url = cluster.entry.url  # the node holding stage 0
            stream_completion(url, "warm up", 4)
            since = time.perf_counter_ns()
            run = stream_completion(url, PROMPT, args.tokens)
        rows = hop_trace.timeline([e for e in hop_trace.load(trace_dir) if e[0] > since])
    print(f"{args.nodes} node(s), one stream, {run.tokens} tokens; entry = stage 0")
    print(f"| {'gap':44s} | median µs | steps |")
    print(f"|{'-' * 46}|----------:|------:|")
    total = 0.0
    for name, crosses, median_us, n in rows:
        total += median_us
        print(f"| {name + (' *' if crosses else ''):44s} | {median_us:9.0f} | {n:5d} |")
    print(f"| {'sum of medians (one decode step)':44s} | {total:9.0f} |       |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
