"""Decode speed of one swarm node with drafts (--speculate lookup) and without, on swarm-bench's prompts
(free text; edit a function, fix a paragraph's typos, list a text's names), same node, requests alternating.

    python benchmarks/speculation_speed.py [--model DIR|GGUF] [--prompts free,edit,typos,names] [--tokens 64]
                                           [--runs 3]

One node, greedy plain completions over HTTP; each prompt (a distinct first line per run, as swarm-bench's
cold prompts) is sent with `"speculate": true` and `false` in turn (the node's own switch per request), so
both meet the same load, which a table of separately started setups does not. Decode tok/s excludes the
prompt: a run of n tokens against a run of 1 token of the same request, both after the prompt was read once
(the prompt cache holds it for them). Also prints whether the texts are equal and the tokens per drafting
step the node counted.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from node_process import running_node  # noqa: E402
from swarm.bench.prompts import PROMPTS, cold  # noqa: E402


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())


def decode_tps(url: str, text: str, n: int, speculate: bool) -> tuple[float, str]:
    body = {"prompt": text, "temperature": 0, "speculate": speculate}
    post(url, {**body, "max_tokens": 1})  # (the prompt read once, then kept: both runs below start from it)
    t = time.perf_counter()
    post(url, {**body, "max_tokens": 1})
    t1 = time.perf_counter() - t
    t = time.perf_counter()
    reply = post(url, {**body, "max_tokens": n})
    tn = time.perf_counter() - t
    return (reply["usage"]["completion_tokens"] - 1) / (tn - t1), reply["choices"][0]["text"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", default="free,edit,typos,names")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with running_node(Path(tmp), *(["--model", args.model] if args.model else [])) as node:
            decode_tps(node.url, "hello", 4, True)  # warm-up
            for name in args.prompts.split(","):
                on, off, same, passes = [], [], True, []
                for r in range(args.runs):
                    # new to the node; as swarm-bench's single-stream runs and draft_replay's variants
                    text = cold(PROMPTS[name], r + 1)
                    before = node.health()[1]["speculation"]
                    for speculate in ((True, False) if r % 2 == 0 else (False, True)):  # (the order alternates)
                        tps, out = decode_tps(node.url, text, args.tokens, speculate)
                        (on if speculate else off).append((tps, out))
                    after = node.health()[1]["speculation"]
                    steps = after["steps"] - before["steps"]
                    if steps:
                        passes.append((after["drafts_accepted"] - before["drafts_accepted"] + steps) / steps)
                    same = same and on[-1][1] == off[-1][1]
                rows.append((name, statistics.median(t for t, _ in on), statistics.median(t for t, _ in off), same,
                             statistics.median(passes) if passes else None))
    print(f"\none node, greedy, {args.tokens} tokens, median of {args.runs} runs (with and without drafts in turn)\n")
    print("| prompt | tok/s with drafts | tok/s without | ratio | tokens per drafting step | same text |")
    print("|---|---:|---:|---:|---:|---|")
    for name, a, b, same, per_step in rows:
        print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {'-' if per_step is None else f'{per_step:.2f}'} | "
              f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
