"""Decode speed of one swarm node with drafts (--speculate lookup) and without, on an input-grounded prompt
and on free chat, same node, same run.

    python benchmarks/speculation_speed.py [--model DIR|GGUF] [--tokens 60] [--runs 2]

One node, greedy chat completions over HTTP; each request is sent with `"speculate": true` and `false` in
turn (the node's own switch per request), so both meet the same load. Decode tok/s excludes the prompt: a
run of n tokens against a run of 1 token of the same request (whose prompt the prompt cache then holds
for both). Also prints the texts' equality and the node's draft counters.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from node_process import running_node  # noqa: E402

PROMPTS = {
    "fix the typos in a paragraph": "Fix the typos in this paragraph: The city council met on Tuesday to discuss "
    "the new park. Many residents came to share their views about the playground, the trees and the parking. The "
    "mayor said the plan would be ready by the end of the yaer, and that work would start in the spring.",
    "free chat": "Write a short story about a dragon who learns to bake bread.",
}


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())


def decode_tps(url: str, text: str, n: int, speculate: bool) -> tuple[float, str]:
    body = {"messages": [{"role": "user", "content": text}], "temperature": 0, "speculate": speculate}
    t = time.perf_counter()
    post(url, {**body, "max_tokens": 1})
    t1 = time.perf_counter() - t
    t = time.perf_counter()
    reply = post(url, {**body, "max_tokens": n})
    tn = time.perf_counter() - t
    return (reply["usage"]["completion_tokens"] - 1) / (tn - t1), reply["choices"][0]["message"]["content"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=60)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with running_node(Path(tmp), *(["--model", args.model] if args.model else [])) as node:
            decode_tps(node.url, "hello", 4, True)  # warm-up
            for name, text in PROMPTS.items():
                on, off, same = [], [], True
                for _ in range(args.runs):
                    a, ta = decode_tps(node.url, text, args.tokens, True)
                    b, tb = decode_tps(node.url, text, args.tokens, False)
                    on.append(a)
                    off.append(b)
                    same = same and ta == tb
                rows.append((name, statistics.median(on), statistics.median(off), same))
            counters = node.health()[1]["speculation"]
    print(f"\none node, greedy, {args.tokens} tokens, median of {args.runs} runs (on and off in turn)\n")
    print("| prompt | tok/s with drafts | tok/s without | ratio | same text |")
    print("|---|---:|---:|---:|---|")
    for name, a, b, same in rows:
        print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {'yes' if same else 'NO'} |")
    print(f"\nthe node's counters: {counters}")


if __name__ == "__main__":
    main()
