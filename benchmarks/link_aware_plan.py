"""Tokens/s of the plan that sees the links against the plan of the network-blind partitioner.

    sudo .venv/bin/python benchmarks/link_aware_plan.py [--hold-ms 30] [--tokens 32] [--runs 3] [--model DIR]

Three nodes on network-namespace hosts (tests/netns.py; root), equal stated speeds; the link between
node 1 and node 2 carries HOLD_MS each way (each holds every data frame to the other that long:
SWARM_HOLD_FRAMES, a real delay). The same swarm runs twice: once planning from its measured links,
once with SWARM_PLAN_LINKS=off (the network-blind partitioner, which sees no link). Each prints its plan and
greedy single-stream decode rate (best of --runs, after a warm-up). The default model is a small random
llama (6 layers, hidden 512), where a stage's compute is well under the slow link; with
--model pointing at a larger model, the layers' compute may outweigh the link and both plans agree.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from discovery.node_id import load_or_mint_node_id  # noqa: E402
from helpers import chat_body  # noqa: E402
from model_zoo import build_random_model  # noqa: E402
from netns import netns_unavailable_reason  # noqa: E402
from swarm_cluster import SwarmCluster  # noqa: E402

QUESTION = "Write a long story about a lighthouse keeper."


def run(root: Path, model: Path, hold_ms: int, tokens: int, runs: int, plan_links: bool) -> tuple[list, float]:
    ids = [load_or_mint_node_id(root / f"state{i}") for i in range(3)]
    cluster = SwarmCluster(root, 3, ["--model", str(model)], start=False)
    try:
        env = {} if plan_links else {"SWARM_PLAN_LINKS": "off"}
        cluster.nodes[0].start(env=env)
        cluster.nodes[1].start(env={**env, "SWARM_HOLD_FRAMES": f"{ids[2]}:{hold_ms}"})
        cluster.nodes[2].start(env={**env, "SWARM_HOLD_FRAMES": f"{ids[1]}:{hold_ms}"})
        cluster.wait_serving(timeout=240)
        time.sleep(20)  # links measured and advertised, and any re-plan they bring agreed
        top = cluster.wait_serving(timeout=240)
        stages = [(ids.index(s["node_id"]), s["end"] - s["start"]) for s in top["plan"]["stages"]]
        body = chat_body(QUESTION, tokens)
        cluster.nodes[0].post("/v1/chat/completions", body, timeout=600)  # warm-up
        best = 0.0
        for _ in range(runs):
            t0 = time.monotonic()
            status, reply = cluster.nodes[0].post("/v1/chat/completions", body, timeout=600)
            took = time.monotonic() - t0
            assert status == 200, reply
            best = max(best, reply["usage"]["completion_tokens"] / took)
        return stages, best
    finally:
        cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold-ms", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", type=Path)
    args = parser.parse_args()
    if (why := netns_unavailable_reason()) is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or build_random_model(Path(tmp) / "llama", "llama", n_layers=6, hidden=512, heads=8,
                                                 kv_heads=2, intermediate=1024, seed=3)
        print(f"3 nodes, {args.hold_ms} ms each way between node 1 and node 2; model {model}")
        results = {}
        for links in (True, False):
            stages, rate = run(Path(tmp) / ("links" if links else "blind"), Path(model), args.hold_ms,
                               args.tokens, args.runs, links)
            name = "plan from measured links" if links else "network-blind plan (SWARM_PLAN_LINKS=off)"
            results[links] = rate
            print(f"{name:42s} stages (node, layers) {stages}: {rate:.1f} tok/s")
        print(f"ratio: {results[True] / results[False]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
