"""Where a decoded token's time goes in a local swarm: py-spy on every node during a long decode.

    python benchmarks/profile_nodes.py [--model DIR] [--nodes 2] [--seconds 20] [--out DIR]

Starts the nodes (loopback, static peers, even split), streams long greedy
completions at concurrency 1, samples every node with `py-spy record --format raw
--idle --threads --nonblocking` (pip install py-spy), writes the collapsed stacks
per node to --out, and prints each node's share of samples per category.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.bench.client import stream_completion  # noqa: E402
from swarm.bench.cluster import LocalCluster  # noqa: E402
from swarm.bench.prompts import PROMPT  # noqa: E402

# First match wins, tested against the whole collapsed stack (innermost frame last).
CATEGORIES = [
    ("mlx compute (Stage.forward / eval)", ("Stage.forward", "shard.py", "libmlx", "mlx::core")),
    ("mlx thread idle (waiting for work)", ("_serve (swarm/engine/worker.py",)),
    ("sampling / array->bytes", ("sampling.py", "arrays.py", "tobytes", "messages.py", "encode_array")),
    ("msgpack + frames", ("frames.py", "msgpack")),
    ("socket I/O (data lane, listener)", ("connection.py", "lane.py", "listener.py", "selector_events.py", "sock_")),
    ("HTTP / SSE / detokenize", ("aiohttp", "sse.py", "completions.py", "text_output.py", "tokenizer")),
    ("event loop (select, scheduling)", ("select (", "epoll", "base_events.py", "events.py")),
    ("thread hand-off (executor, futures)", ("thread.py", "futures", "_base.py", "queue.py")),
]


def categorize(stack: str) -> str:
    for name, needles in CATEGORIES:
        if any(n in stack for n in needles):
            return name
    return "other"


def summarize(raw: Path) -> tuple[Counter, Counter, int]:
    """(samples per category, samples per innermost frame, total) from py-spy's collapsed stacks."""
    cats, leaves, total = Counter(), Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        thread = frames[0]
        cats[f"{thread.split(' ')[0][:30]}: {categorize(stack)}"] += n
        leaves[frames[-1][:110]] += n
        if len(frames) > 1 and "libmlx" in frames[-1]:  # name the Python caller of native frames
            leaves["native under " + next((f for f in reversed(frames) if ".py" in f), "?")[:90]] += 0
    return cats, leaves, total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--out", type=Path, default=Path("swarm-bench-profile"))
    p.add_argument("--native", action="store_true",
                   help="also sample C/C++ frames (pauses the process per sample: use to look inside MLX)")
    args = p.parse_args(argv)
    spy = shutil.which("py-spy")
    if spy is None:
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="swarm-profile-") as tmp, \
            LocalCluster(args.nodes, Path(tmp), args.model) as cluster:
        url, stop = cluster.entry.url, threading.Event()
        stream_completion(url, PROMPT, 8)  # warm-up

        def load() -> None:  # bounded: stops when the sampling window ends
            while not stop.is_set():
                run = stream_completion(url, PROMPT, args.tokens)
                print(f"decode {run.decode_tps:.1f} tok/s", file=sys.stderr)
        client = threading.Thread(target=load, daemon=True)
        client.start()
        time.sleep(1.0)  # past prefill
        spies = []
        for node_id, pid in cluster.pids().items():
            # Non-blocking, Python frames only: pausing the process per sample (--native)
            # would stretch exactly the hand-offs we want to see.
            spies.append(subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--duration", str(int(args.seconds)),
                 *(["--native", "--rate", "50"] if args.native else ["--nonblocking", "--rate", "250"]),
                 "--threads", "--idle", "--format", "raw",
                 "--output", str(args.out / f"{node_id}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            for s in spies:
                s.wait(args.seconds + 60)
        finally:
            for s in spies:
                if s.poll() is None:
                    s.kill()
            stop.set()
            client.join(120)
        for node_id in cluster.pids():
            raw = args.out / f"{node_id}.txt"
            if not raw.exists():
                print(f"{node_id}: no profile (py-spy needs ptrace permission)")
                continue
            cats, leaves, total = summarize(raw)
            print(f"\n## {node_id} ({total} samples, all threads, idle included)")
            for name, n in cats.most_common(14):
                print(f"{100 * n / total:5.1f}%  {name}")
            print("top innermost frames:")
            for name, n in leaves.most_common(12):
                print(f"{100 * n / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
