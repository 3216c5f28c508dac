"""The plan the swarm chooses over slow links against every order of its stages tried by hand.

    sudo .venv/bin/python benchmarks/link_orders.py [--part a|b|both] [--hold-ms 30] [--tokens 24] [--runs 2]
                                                    [--prompt-words 700]

Four nodes on network-namespace hosts (tests/netns.py; root), equal stated speeds and memory
(--memory-limit, --prompt-cache 0); requests always go to node 0 (the entry). Node 3 is the node with
the slow links.

(a) Node 3's links carry HOLD_MS each way: node 3 holds every data frame it sends for HOLD_MS, and
    every other node holds every frame it sends to node 3 as long (SWARM_HOLD_FRAMES, a real delay).
    Greedy single-stream decode tok/s (a warm-up, then the best of --runs) of the plan the swarm
    chooses from its measured links, and of every distinct arrangement by hand: node 3 at each of the
    four positions (the fast nodes 0, 1, 2 in that order around it), and the three fast nodes without
    node 3. Then the same swarm with equal links (no hold): its plan must be the network-blind one.
(b) Node 3's veth is shaped to 100 Mbit both ways with tbf (its bridge-side end in the bridge
    namespace, its own eth0 in its namespace); the other links are veths (well over 10 Gbit). A wider
    random llama (hidden 2048, float32: 8 KiB of activations per position) and a long prompt, new for
    every request (nothing cached): time to first token (a one-token reply) of the chosen plan and of
    every order by hand, best of --runs after a warm-up.

An order "by hand" is the network-blind partitioner's plan (SWARM_PLAN_LINKS=off) for node ids
chosen so that it sorts the nodes in that order (equal speed and memory: stages follow node ids). No
switch of the product forces it. The ratios chosen/best are printed; the targets are decode >= 0.9x
the best order's rate and prefill <= 1.15x the best order's time.
"""

from __future__ import annotations

import argparse
import secrets
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import chat_body  # noqa: E402
from model_zoo import build_random_model  # noqa: E402
from netns import netns_unavailable_reason  # noqa: E402
from swarm_cluster import SwarmCluster  # noqa: E402

SLOW = 3  # the node with the slow links; node 0 is the entry
print = partial(print, flush=True)  # noqa: A001 (progress shows while it runs)
COMMON = ["--memory-limit", "2G", "--prompt-cache", "0"]
QUESTION = "Write a long story about a lighthouse keeper."
WORDS = ("harbor lantern keeper storm granite gull tide rope ledger beacon whistle current fog "
         "shipwright morning compass anchor pebble signal winter").split()


def ids_for(order: list[int]) -> list[str]:
    """Node ids (by node index) that sort the nodes in `order`: stage k's node id starts with k."""
    ids = [""] * 4
    for rank, node in enumerate(order):
        ids[node] = f"{rank}{secrets.token_hex(8)[1:]}"
    return ids


class Swarm:
    """Four hosts; `started` nodes run with the given ids and environments."""

    def __init__(self, root: Path, model: Path, ids: list[str], envs: list[dict], started=range(4),
                 shape_slow: bool = False):
        self.ids = ids
        self.cluster = SwarmCluster(root, 4, ["--model", str(model), *COMMON],
                                    per_node=[["--node-id", i] for i in ids], start=False)
        try:
            if shape_slow:
                shape(self.cluster, SLOW)
            self.started = [self.cluster.nodes[i] for i in started]
            for i in started:
                self.cluster.nodes[i].start(env=envs[i])
        except BaseException:
            self.cluster.close()
            raise

    def plan(self, settle: float) -> tuple[list[tuple[int, int]], str]:
        self.cluster.wait_serving(nodes=self.started, timeout=240)
        if settle:  # every node's links to the others measured and advertised, and the re-plan they bring agreed
            self.cluster.wait_for("every link advertised", self.links_advertised, timeout=300, every=2.0)
            time.sleep(settle)
        top = self.cluster.wait_serving(nodes=self.started, timeout=240)
        stages = [(self.ids.index(s["node_id"]), s["end"] - s["start"]) for s in top["plan"]["stages"]]
        return stages, top["plan"]["id"]

    def links_advertised(self) -> bool:
        top = self.entry().topology()
        ids = {self.ids[n.index] for n in self.started}
        seen = {n["id"]: set(n["measured_links"]) for n in (top or {}).get("nodes", [])}
        return all(ids - {i} <= seen.get(i, set()) for i in ids)

    def entry(self):
        return self.cluster.nodes[0]

    def close(self) -> None:
        self.cluster.close()


def shape(cluster: SwarmCluster, index: int, rate: str = "100mbit") -> None:
    """tbf on both ends of a host's veth: toward it (bridge side) and from it (its eth0)."""
    host = cluster.nodes[index].host
    tbf = ["tc", "qdisc", "add", "dev"]
    rest = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
    subprocess.run(["ip", "netns", "exec", cluster.network.bridge_ns, *tbf, host.veth, *rest], check=True,
                   capture_output=True, timeout=30)
    host.exec(*tbf, "eth0", *rest)


def decode_rate(node, tokens: int, runs: int) -> float:
    body = chat_body(QUESTION, tokens)
    node.post("/v1/chat/completions", body, timeout=600)  # warm-up
    best = 0.0
    for _ in range(runs):
        t0 = time.monotonic()
        status, reply = node.post("/v1/chat/completions", body, timeout=600)
        took = time.monotonic() - t0
        assert status == 200, reply
        best = max(best, reply["usage"]["completion_tokens"] / took)
    return best


def long_prompt(words: int) -> str:
    nonce = secrets.token_hex(4)  # a new start: no two requests share a prefix
    return f"{nonce} " + " ".join(WORDS[(i * 7 + len(nonce)) % len(WORDS)] for i in range(words))


def prefill_time(node, words: int, runs: int) -> tuple[float, int]:
    node.post("/v1/chat/completions", chat_body(long_prompt(words), 1), timeout=600)  # warm-up
    best, prompt_tokens = float("inf"), 0
    for _ in range(runs):
        t0 = time.monotonic()
        status, reply = node.post("/v1/chat/completions", chat_body(long_prompt(words), 1), timeout=600)
        took = time.monotonic() - t0
        assert status == 200, reply
        best, prompt_tokens = min(best, took), reply["usage"]["prompt_tokens"]
    return best, prompt_tokens


def by_hand() -> list[tuple[str, list[int], range]]:
    """(name, stage order, nodes started): node 3 at each position among 0, 1, 2, and left out."""
    cases = []
    for pos in range(4):
        order = [0, 1, 2]
        order.insert(pos, SLOW)
        cases.append((f"node 3 {['first', 'second', 'third', 'last'][pos]}", order, range(4)))
    cases.append(("node 3 left out", [0, 1, 2, SLOW], range(3)))
    return cases


def show(stages: list[tuple[int, int]]) -> str:
    return " -> ".join(f"n{n}:{x}" for n, x in stages)


def part_a(root: Path, model: Path, args) -> bool:
    hold = {i: {"SWARM_HOLD_FRAMES": f"*:{args.hold_ms}"} if i == SLOW else None for i in range(4)}
    print(f"\n(a) {args.hold_ms} ms each way on every link of node 3; greedy decode of {args.tokens} tokens, "
          f"best of {args.runs}; entry node 0")
    rows = []
    # The chosen plan, with ids that the network-blind planner orders 0, 3, 1, 2 (node 3 in the middle).
    blind_ids = ids_for([0, SLOW, 1, 2])

    def envs(ids: list[str], extra: dict) -> list[dict]:
        out = []
        for i in range(4):
            env = dict(extra)
            if i == SLOW:
                env.update(hold[SLOW])
            else:
                env["SWARM_HOLD_FRAMES"] = f"{ids[SLOW]}:{args.hold_ms}"
            out.append(env)
        return out

    swarm = Swarm(root / "a-chosen", model, blind_ids, envs(blind_ids, {}))
    try:
        stages, _ = swarm.plan(settle=10)
        rate = decode_rate(swarm.entry(), args.tokens, args.runs)
    finally:
        swarm.close()
    chosen = ("chosen (links measured)", stages, rate)
    for name, order, started in by_hand():
        ids = ids_for(order)
        swarm = Swarm(root / f"a-{order}-{len(started)}", model, ids, envs(ids, {"SWARM_PLAN_LINKS": "off"}),
                      started=started)
        try:
            stages, _ = swarm.plan(settle=0)
            rows.append((f"by hand: {name}", stages, decode_rate(swarm.entry(), args.tokens, args.runs)))
        finally:
            swarm.close()
    best = max(rows, key=lambda r: r[2])
    print(f"{'plan':34s} {'stages (node:layers)':34s} {'tok/s':>7s}")
    for name, stages, rate in [chosen, *rows]:
        print(f"{name:34s} {show(stages):34s} {rate:7.1f}")
    ratio = chosen[2] / best[2]
    print(f"chosen / best by hand ({best[0][9:]}): {ratio:.2f}x (target >= 0.90x)")

    # Equal links: the same ids, no hold, links measured; then the network-blind plan of the same swarm.
    plans = {}
    for name, extra in (("links measured", {}), ("SWARM_PLAN_LINKS=off", {"SWARM_PLAN_LINKS": "off"})):
        swarm = Swarm(root / f"a-equal-{len(plans)}", model, blind_ids, [extra] * 4)
        try:
            plans[name] = swarm.plan(settle=10 if not extra else 0)
        finally:
            swarm.close()
    same = plans["links measured"] == plans["SWARM_PLAN_LINKS=off"]
    print("equal links: " + "; ".join(f"{k}: {show(v[0])} (plan {v[1]})" for k, v in plans.items())
          + f": {'the same plan' if same else 'DIFFERENT plans'}")
    return ratio >= 0.9 and same


def part_b(root: Path, model: Path, args) -> bool:
    print(f"\n(b) node 3's veth shaped to 100 Mbit both ways (tbf), the others unshaped; model hidden "
          f"{args.hidden} float32 ({args.hidden * 4} bytes of activations per position); a new prompt of "
          f"{args.prompt_words} words each request; time to a one-token reply, best of {args.runs}; entry node 0")
    rows = []
    ids = ids_for([0, SLOW, 1, 2])  # network-blind: node 3 in the middle
    swarm = Swarm(root / "b-chosen", model, ids, [{}] * 4, shape_slow=True)
    try:
        stages, _ = swarm.plan(settle=10)
        took, tokens = prefill_time(swarm.entry(), args.prompt_words, args.runs)
    finally:
        swarm.close()
    chosen = ("chosen (links measured)", stages, took)
    for name, order, started in by_hand():
        ids = ids_for(order)
        swarm = Swarm(root / f"b-{order}-{len(started)}", model, ids, [{"SWARM_PLAN_LINKS": "off"}] * 4,
                      started=started, shape_slow=True)
        try:
            stages, _ = swarm.plan(settle=0)
            rows.append((f"by hand: {name}", stages, prefill_time(swarm.entry(), args.prompt_words, args.runs)[0]))
        finally:
            swarm.close()
    best = min(rows, key=lambda r: r[2])
    print(f"prompt: {tokens} tokens, {tokens * args.hidden * 4 / 1e6:.1f} MB of activations per hop "
          f"({tokens * args.hidden * 4 * 8 / 100e6:.2f} s at 100 Mbit)")
    print(f"{'plan':34s} {'stages (node:layers)':34s} {'prefill s':>9s}")
    for name, stages, took in [chosen, *rows]:
        print(f"{name:34s} {show(stages):34s} {took:9.2f}")
    ratio = chosen[2] / best[2]
    print(f"chosen / best by hand ({best[0][9:]}): {ratio:.2f}x (target <= 1.15x)")
    return ratio <= 1.15


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["a", "b", "both"], default="both")
    parser.add_argument("--hold-ms", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=2048, help="(b)'s model's hidden size")
    parser.add_argument("--prompt-words", type=int, default=700, help="(b)'s prompt length in words")
    args = parser.parse_args()
    if (why := netns_unavailable_reason()) is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    held = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.part in ("a", "both"):
            small = build_random_model(root / "llama", "llama", n_layers=8, hidden=512, heads=8, kv_heads=2,
                                       intermediate=1024, seed=3)
            print("(a)'s model: random llama, 8 layers, hidden 512")
            held &= part_a(root, small, args)
        if args.part in ("b", "both"):
            wide = build_random_model(root / "wide", "llama", n_layers=4, hidden=args.hidden, heads=16, kv_heads=4,
                                      intermediate=512, seed=5)
            print(f"(b)'s model: random llama, 4 layers, hidden {args.hidden}, intermediate 512")
            held &= part_b(root, wide, args)
    print(f"\n{'every target held' if held else 'a target was missed'} ({time.monotonic() - started:.0f} s)")
    return 0 if held else 1


if __name__ == "__main__":
    raise SystemExit(main())
