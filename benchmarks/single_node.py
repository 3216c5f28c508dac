"""Decode speed of one swarm node over HTTP vs mlx_lm.generate on the same model, same run.

    python benchmarks/single_node.py [--model DIR|GGUF] [--tokens 64] [--runs 3]

Prints a table. Decode tok/s is measured from the first generated token to the
last, so prefill is excluded on both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.utils import load, load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from node_process import running_node  # noqa: E402

from swarm.engine.sampling import SamplingParams  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402
from swarm.engine.shard_runner import ShardRunner  # noqa: E402
from swarm.engine.worker import MlxWorker  # noqa: E402
from local_pipeline import LocalPipeline  # noqa: E402  (tests/: all stages in one process)

from swarm.entry.generate import GenerationJob, generate_tokens  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402

PROMPT = "Once upon a time, in a small village by the sea, there lived"


def mlx_lm_decode_tps(model_dir: Path, n: int) -> float:
    model, tokenizer = load(str(model_dir))
    model.apply(lambda x: x.astype(mx.float32) if mx.issubdtype(x.dtype, mx.floating) else x)
    times = []
    for r in stream_generate(model, tokenizer, PROMPT, max_tokens=n):
        times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def engine_decode_tps(model_dir: Path, prompt: list[int], n: int) -> float:
    """The swarm engine in this process, no HTTP: one local stage with all layers."""
    worker = MlxWorker()
    pipeline = LocalPipeline([ShardRunner(worker.run_sync(load_shard, model_dir, 0, None, mx.float32))], worker)

    async def run():
        async def source(_broken=None):
            return pipeline
        times = []
        job = GenerationJob("bench", prompt, SamplingParams(), n)
        async for _ in generate_tokens(job, source):
            times.append(time.perf_counter())
        return (len(times) - 1) / (times[-1] - times[0])
    try:
        return asyncio.run(run())
    finally:
        worker.close()


def node_decode_tps_by_tokens(url: str, n: int) -> float:
    """Time per generated token through the node: non-streamed runs of n and 1 token."""
    def timed(max_tokens: int) -> tuple[float, int]:
        body = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t = time.perf_counter()
        with urllib.request.urlopen(req) as resp:
            usage = json.loads(resp.read())["usage"]
        return time.perf_counter() - t, usage["completion_tokens"]
    t1, _ = timed(1)  # prefill + first token
    tn, got = timed(n)
    return (got - 1) / (tn - t1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    model = resolve_model(args.model, backend="cpu" if not mx.metal.is_available() else None)

    ref = [mlx_lm_decode_tps(model.path, args.tokens) for _ in range(args.runs)]
    prompt = load_tokenizer(model.path).encode(PROMPT)
    engine = [engine_decode_tps(model.path, prompt, args.tokens) for _ in range(args.runs)]
    with tempfile.TemporaryDirectory() as tmp:
        node_args = ["--model", args.model] if args.model else []
        with running_node(Path(tmp), *node_args) as node:
            node_decode_tps_by_tokens(node.url, 4)  # warm-up
            ours = [node_decode_tps_by_tokens(node.url, args.tokens) for _ in range(args.runs)]

    r, e, o = statistics.median(ref), statistics.median(engine), statistics.median(ours)
    print(f"\nmodel: {model.model_id}  backend: {mx.default_device()}  decode of {args.tokens} tokens, "
          f"median of {args.runs}\n")
    print("| setup | decode tok/s | ratio to mlx-lm |")
    print("|---|---:|---:|")
    print(f"| mlx_lm.generate (in process) | {r:.2f} | 1.00 |")
    print(f"| swarm engine (in process, no HTTP) | {e:.2f} | {e / r:.3f} |")
    print(f"| swarm-node over HTTP | {o:.2f} | {o / r:.3f} |")
    print(f"\nHTTP path cost (node vs engine in process): {100 * (1 - o / e):.1f}% of throughput")
    print("mlx_lm.generate evaluates on a separate generation stream with async_eval; on a 2-core CPU "
          "that is slower than the default stream the swarm engine uses.")


if __name__ == "__main__":
    main()
