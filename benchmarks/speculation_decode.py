"""Tokens per pass and decode speed with and without drafts, on one node holding the whole model (in process:
the stage's ShardRunner behind the entry's generation loop, tests/local_pipeline.py), side by side in one run.

    python benchmarks/speculation_decode.py [--model DIR|GGUF] [--tokens 64]

Two prompts: an input-grounded one (fix the typos in a paragraph: the answer copies its input) and free chat.
Greedy; prints, per prompt, decode tokens per second (after the first token) with drafts off and on, tokens per
pass, drafts proposed and accepted, and whether the texts are equal. Run it under the BLAS a node uses.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from mlx_lm.utils import load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from local_pipeline import LocalPipeline  # noqa: E402

from swarm.backend import this_backend  # noqa: E402
from swarm.engine.blas import blas_in_use  # noqa: E402
from swarm.engine.sampling import SamplingParams  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402
from swarm.engine.shard_runner import ShardRunner  # noqa: E402
from swarm.engine.worker import MlxWorker  # noqa: E402
from swarm.entry.generate import GenerationJob, generate_tokens  # noqa: E402
from swarm.entry.speculation import Speculation  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402

PROMPTS = {
    "fix the typos": "Fix the spelling in this paragraph: The quick brown fox jumpd over the lazzy dog. It was a "
                     "sunny day and the birds were singing in the tall trees near the rivr.",
    "free chat": "Write a short story about a dragon who learns to bake bread.",
}


def run(pipeline, tok, text: str, max_tokens: int, spec: Speculation | None) -> tuple[list[int], float]:
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)

    async def pipe(_broken=None):
        return pipeline

    async def go():
        job = GenerationJob("b", prompt, SamplingParams(), max_tokens, eos_ids=frozenset(tok.eos_token_ids),
                            speculation=spec.for_request() if spec else None)
        out, first = [], None
        async for t in generate_tokens(job, pipe):
            out.append(t)
            first = first or time.perf_counter()
        return out, (len(out) - 1) / (time.perf_counter() - first) if len(out) > 1 else 0.0
    return asyncio.run(go())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    backend = this_backend()
    model_dir = resolve_model(args.model, backend=backend.kind).path
    tok = load_tokenizer(Path(model_dir))
    worker = MlxWorker()
    stage = ShardRunner(worker.run_sync(load_shard, Path(model_dir), 0, None, backend.weights_dtype("auto")))
    pipeline = LocalPipeline([stage], worker)
    print(f"backend {backend.describe()}, BLAS {blas_in_use()}, model {model_dir.name}, greedy, "
          f"{args.tokens} tokens at most\n")
    print("| prompt | tokens | tok/s off | tok/s on | x | tokens a pass | drafts proposed / accepted | same text |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, text in PROMPTS.items():
        run(pipeline, tok, text, 4, None)  # warm
        off, off_tps = run(pipeline, tok, text, args.tokens, None)
        spec = Speculation()
        on, on_tps = run(pipeline, tok, text, args.tokens, spec)
        s = spec.stats
        print(f"| {name} | {len(on)} | {off_tps:.1f} | {on_tps:.1f} | {on_tps / off_tps:.2f} | "
              f"{s.tokens / s.passes:.2f} | {s.proposed} / {s.accepted} | {on == off} |")
    worker.close()


if __name__ == "__main__":
    main()
