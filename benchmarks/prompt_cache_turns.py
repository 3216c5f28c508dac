"""Time to first token of a ten-turn conversation and a repeated long prompt, with and without prompt caches.

    sudo .venv/bin/python benchmarks/prompt_cache_turns.py [--turns 10] [--max-tokens 32] [--secret]

On 3 network-namespace hosts (tests/netns.py; root) serving the default model, the official openai client
streams a conversation whose every turn sends the whole history (~150 new user tokens a turn, greedy
answers), then one ~1,725-token prompt twice. The same runs on a cold node (one node, `--prompt-cache 0`)
give the reference texts and the cold figures. Prints one row per turn (its prompt's tokens; per run the
positions the stages started from, from the entry node's /health, the positions prefilled and the time to
first token) and the issue's two targets:
turn 10's time to first token at most 1.3x turn 1's, and the long prompt's repeat at most 15% of its first
run; and whether every text equals the cold node's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chat_turns import Turn, conversation, long_prompt, stream_chat  # noqa: E402
from netns import netns_unavailable_reason  # noqa: E402
from swarm_cluster import SwarmCluster  # noqa: E402


def run_all(node, turns: int, max_tokens: int) -> tuple[list[Turn], list[Turn]]:
    return conversation(node, turns, max_tokens), [stream_chat(node, long_prompt(), max_tokens) for _ in range(2)]


def swarm(root: Path, n: int, args: list[str], secret: str | None, turns: int, max_tokens: int):
    # A cold prefill of ~1,700 tokens on a loaded 2-core machine can take minutes: let the entry wait for it.
    cluster = SwarmCluster(root, n, [*args, "--token-timeout", "900"], secret=secret)
    try:
        cluster.wait_serving(stages=n, timeout=600)
        return run_all(cluster.nodes[0], turns, max_tokens)
    finally:
        cluster.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--secret", action="store_true", help="also run the 3 hosts with a swarm secret")
    ap.add_argument("--no-cold", action="store_true",
                    help="skip the cold node (its turns take minutes on a loaded CPU): no cold figures, no texts compared")
    args = ap.parse_args()
    if (why := netns_unavailable_reason()) is not None:
        raise SystemExit(f"needs network namespaces: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs = {} if args.no_cold else {
            "cold 1 node": swarm(root / "cold", 1, ["--swarm", "cold", "--prompt-cache", "0"], None, args.turns,
                                 args.max_tokens)}
        runs["3 hosts"] = swarm(root / "open", 3, [], None, args.turns, args.max_tokens)
        if args.secret:
            runs["3 hosts, secret"] = swarm(root / "secret", 3, [], "prompt cache bench secret", args.turns,
                                            args.max_tokens)
    names = list(runs)
    print(f"{'turn':>6} {'prompt':>7} " + " ".join(f"{n + ' reused/prefilled/ttft s':>34}" for n in names))
    cold_turns, cold_long = runs[names[0]]
    for k in range(args.turns):
        print(f"{k + 1:>6} {cold_turns[k].prompt_tokens:>7} " + " ".join(
            f"{f'{t.reused} / {t.prefilled} / {t.ttft_s:.2f}':>34}" for t in (runs[n][0][k] for n in names)))
    for k in range(2):
        print(f"{'long' + str(k + 1):>6} {cold_long[k].prompt_tokens:>7} "
              + " ".join(f"{runs[n][1][k].ttft_s:>22.2f}" for n in names))
    print()
    for name in names:
        turns, long = runs[name]
        growth, repeat = turns[-1].ttft_s / turns[0].ttft_s, long[1].ttft_s / long[0].ttft_s
        same = "not compared" if args.no_cold else [t.text for t in turns + long] == [t.text for t in cold_turns + cold_long]
        print(f"{name:>16}: turn {args.turns} / turn 1 = {growth:.2f}x (target <= 1.3x: "
              f"{'met' if growth <= 1.3 else 'NOT met'}); long prompt again / first = {repeat:.0%} (target <= 15%: "
              f"{'met' if repeat <= 0.15 else 'NOT met'}); texts equal the cold node's: {same}")


if __name__ == "__main__":
    main()
