"""Where a conversation's later turns spend their time to first token, with the prompt caches on, in one process.

    python benchmarks/prompt_cache_turn_trace.py [--turns 10] [--max-tokens 32] [--stages 3] [--model DIR|GGUF]

The ten-turn conversation of benchmarks/prompt_cache_turns.py (tests/chat_turns.py: the chat template
renders the whole history, the answers included, on every turn), run by the entry's own generation loop
(entry/generate.py, entry/prompt_index.py) over the default model's stages chained in this process
(tests/local_pipeline.py), so no network and no other node's load is in the figures. Per turn: the
prompt's tokens, how many the stages started from (reused), how many they prefilled, the time to first
token, and what the same positions cost without the kept ones in front (the rest of the prompt alone
from position 0: the part of the time attention over the kept positions adds). Then whether each turn
reused the whole of what the turn before kept (its prompt and its answer but the last token) or the
hit stopped early where the chat template's rendering of the answer tokenizes otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from chat_turns import user_turn  # noqa: E402
from local_pipeline import LocalPipeline  # noqa: E402  (tests/: all stages in one process)

from swarm.engine.sampling import SamplingParams  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402
from swarm.engine.shard_runner import ShardRunner  # noqa: E402
from swarm.engine.worker import MlxWorker  # noqa: E402
from swarm.entry.chat_prompt import ChatPrompt  # noqa: E402
from swarm.entry.generate import GenerationJob, generate_tokens  # noqa: E402
from swarm.entry.prompt_index import PromptIndex  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402


class TracedPipeline(LocalPipeline):
    """Notes the position each attempt started from (the reused length) and the positions it prefilled."""

    def reset(self) -> None:
        self.started_at, self.prefilled, self.sampled = None, 0, False

    async def forward(self, request_id, tokens, start_pos, sampling, continue_unless=None, rules=None, prefix=None):
        if self.started_at is None or prefix is not None or start_pos == 0:  # (an attempt starts)
            self.started_at, self.prefilled, self.sampled = start_pos, 0, False
        if not self.sampled:  # the prompt's chunks and its last token, not the decode steps after
            self.prefilled += len(tokens)
            self.sampled = sampling is not None
        return await super().forward(request_id, tokens, start_pos, sampling, continue_unless, rules, prefix)


def ask(pipeline: TracedPipeline, rid: str, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    """Greedy tokens and the time to the first one."""
    async def pipe(_broken=None):
        return pipeline

    async def run():
        job = GenerationJob(rid, prompt, SamplingParams(temperature=0.0), max_tokens)
        t0, first, out = time.perf_counter(), None, []
        async for token in generate_tokens(job, pipe):
            first = first or time.perf_counter()
            out.append(token)
        return out, first - t0
    pipeline.reset()
    return asyncio.run(run())


def cold_time(stages: list[ShardRunner], worker: MlxWorker, n: int) -> float:
    """n positions prefilled from position 0 and a token sampled: what a turn's rest costs with nothing before it."""
    def run():
        x, t0 = mx.array([[5] * n]), time.perf_counter()
        for s in stages:
            x = s.forward("probe", x, 0, SamplingParams(temperature=0.0) if s.range.is_last else None)
        took = time.perf_counter() - t0
        for s in stages:
            s.release("probe")
        return took
    return worker.run_sync(run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    model = resolve_model(args.model, backend="cpu" if not mx.metal.is_available() else None)
    tokenizer = load_tokenizer(Path(model.path))
    chat = ChatPrompt(tokenizer)
    worker = MlxWorker()
    n_layers = worker.run_sync(lambda: len(load_shard(model.path, 0, None).model.layers))
    cuts = [round(i * n_layers / args.stages) for i in range(args.stages + 1)]
    stages = [ShardRunner(worker.run_sync(load_shard, model.path, a, b), prompt_cache_bytes=512 << 20)
              for a, b in zip(cuts, cuts[1:])]
    pipeline = TracedPipeline(stages, worker, PromptIndex())
    cold_time(stages, worker, 8)  # (kernels warm)
    messages, kept_before = [], None
    print(f"{'turn':>4} {'prompt':>7} {'reused':>7} {'prefilled':>9} {'kept before':>11} {'ttft s':>7} "
          f"{'same rest cold s':>16} {'x':>5}")
    rows = []
    for k in range(args.turns):
        messages.append({"role": "user", "content": user_turn(k)})
        prompt = tokenizer.encode(chat.render(messages), add_special_tokens=False)
        answer, ttft = ask(pipeline, f"t{k}", prompt, args.max_tokens)
        reused, prefilled = pipeline.started_at, pipeline.prefilled
        cold = cold_time(stages, worker, prefilled)
        lost = "" if kept_before is None else ("whole" if reused == kept_before else f"{kept_before - reused} short")
        print(f"{k + 1:>4} {len(prompt):>7} {reused:>7} {prefilled:>9} {lost:>11} {ttft:>7.2f} {cold:>16.2f} "
              f"{ttft / cold:>5.2f}", flush=True)
        rows.append((ttft, cold))
        kept_before = len(prompt) + len(answer) - 1
        messages.append({"role": "assistant", "content": tokenizer.decode(answer)})
    print(f"\nturn {args.turns} / turn 1: {rows[-1][0] / rows[0][0]:.2f}x time to first token; its rest alone from "
          f"position 0 / turn 1: {rows[-1][1] / rows[0][0]:.2f}x")
    worker.close()


if __name__ == "__main__":
    main()
