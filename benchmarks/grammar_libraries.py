"""Per-token cost of each grammar library on the last stage, on a real model: the choice of issue 18.

    python benchmarks/grammar_libraries.py [--model DIR] [--tokens 40] [--rounds 3]

llguidance is the swarm's dependency; xgrammar and outlines-core are measured when
importable (`pip install outlines-core; pip install --no-deps xgrammar apache-tvm-ffi
transformers`: xgrammar's wheel declares torch + CUDA, never used on this path).
The whole model runs as one last stage (swarm's Shard); each decode step fills the
library's mask for the tokens so far, applies it to the last position's logits
inside the forward's evaluation (as request_sampler.py does), draws greedily and
advances the matcher. Rounds alternate libraries so the machine's drift spreads
over all. Prints compile ms, mask / advance µs per token, the decode step, and
what the grammar adds to a plain step.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.grammar_backends import BACKENDS, Spec, apply_mask_numpy, tool_call_schema  # noqa: E402
from benchmarks.last_stage_setup import model_and_prompt, parse_args  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402

PERSON = {"type": "object", "required": ["name", "age", "bio"], "additionalProperties": False,
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0,
                                                                               "maximum": 150},
                         "bio": {"type": "string", "maxLength": 400}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"], "properties": {"city": {"type": "string", "maxLength": 200}}}}}]
SPECS = {"json_object": Spec("json_object"), "json_schema": Spec("json_schema", PERSON),
         "tool call (forced)": Spec("tool_call", tool_call_schema(TOOLS), "<tool_call>\n", "\n</tool_call>")}


def decode(shard, prompt: list[int], n: int, backend=None, compiled=None) -> tuple[list[float], list[float], list[float]]:
    """Greedy decode steps of one request: step, mask-fill and advance times (s), prefill excluded."""
    caches = shard.make_caches()
    m = backend.matcher(compiled) if backend else None
    vocab = None
    bitmask = None
    x = mx.array([prompt])
    steps, fills, advances = [], [], []
    for i in range(n + 1):
        t0 = time.perf_counter()
        logits = shard(x, caches)
        if m is not None:
            vocab = vocab or logits.shape[-1]
            if bitmask is None:
                bitmask = np.full((1, (vocab + 31) // 32), -1, np.int32)
            f0 = time.perf_counter()
            backend.fill(m, bitmask)
            fill = time.perf_counter() - f0
            logits = apply_mask_numpy(logits, bitmask)
        token = mx.argmax(logits)
        mx.eval(token, caches.arrays())
        token = token.item()
        adv = 0.0
        if m is not None:
            a0 = time.perf_counter()
            backend.advance(m, token)
            adv = time.perf_counter() - a0
        if i:  # the first is the prefill
            steps.append(time.perf_counter() - t0)
            if m is not None:
                fills.append(fill)
                advances.append(adv)
        if m is not None and backend.done(m):
            break
        x = mx.array([[token]])
    return steps, fills, advances


def apply_cost(vocab: int, n: int = 200) -> float:
    """Median s to apply a bitmask to (vocab,) logits and draw, beyond drawing alone."""
    logits = mx.random.normal((vocab,))
    bitmask = np.random.default_rng(0).integers(-2**31, 2**31 - 1, (1, (vocab + 31) // 32), dtype=np.int32)
    with_mask, alone = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        mx.eval(mx.argmax(apply_mask_numpy(logits, bitmask)))
        t1 = time.perf_counter()
        mx.eval(mx.argmax(logits))
        t2 = time.perf_counter()
        with_mask.append(t1 - t0)
        alone.append(t2 - t1)
    return max(0.0, statistics.median(with_mask) - statistics.median(alone))


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], tokens=40)
    model_dir, tokenizer, prompt = model_and_prompt(args.model)
    tokenizer_json = (model_dir / "tokenizer.json").read_text()
    shard = load_shard(model_dir, 0, None, mx.float32 if not mx.metal.is_available() else None)
    vocab = shard(mx.array([[1]]), shard.make_caches()).shape[-1]
    eos = sorted(tokenizer.eos_token_ids)
    backends, compiled, compile_ms = {}, {}, {}
    for name, cls in BACKENDS.items():
        try:
            t0 = time.perf_counter()
            backends[name] = cls(tokenizer_json, len(tokenizer.get_vocab()), eos)
            print(f"{name} {backends[name].version}: tokenizer set-up {(time.perf_counter() - t0) * 1e3:.0f} ms")
        except Exception as e:  # not installed: say so, measure the others
            print(f"{name}: not measured ({type(e).__name__}: {e})")
            continue
        for kind, spec in SPECS.items():
            t0 = time.perf_counter()
            compiled[name, kind] = backends[name].compile(spec)
            compile_ms[name, kind] = (time.perf_counter() - t0) * 1e3
    plain: list[float] = []
    rows: dict[tuple, tuple[list, list, list]] = {k: ([], [], []) for k in compiled}
    decode(shard, prompt, 4)
    for _ in range(args.rounds):
        plain += decode(shard, prompt, args.tokens)[0]
        for (name, kind), c in compiled.items():
            for acc, got in zip(rows[name, kind], decode(shard, prompt, args.tokens, backends[name], c)):
                acc += got
    base = statistics.median(plain)
    apply = apply_cost(vocab)
    print(f"\nvocabulary {vocab}; plain decode step {base * 1e3:.2f} ms (median of {len(plain)}); applying a "
          f"mask to the logits {apply * 1e6:.0f} µs (the same for every library)\n")
    print(f"{'library':<15} {'grammar':<19} {'compile ms':>10} {'mask µs':>8} {'p90':>6} {'advance µs':>10} "
          f"{'+ per token µs':>15} {'+ %':>6} {'step ms':>8}")
    for (name, kind), (steps, fills, advances) in rows.items():
        extra = statistics.median(fills) + statistics.median(advances) + apply
        print(f"{name:<15} {kind:<19} {compile_ms[name, kind]:10.1f} {statistics.median(fills) * 1e6:8.1f} "
              f"{np.percentile(fills, 90) * 1e6:6.0f} {statistics.median(advances) * 1e6:10.1f} "
              f"{extra * 1e6:15.0f} {extra / base * 100:6.2f} {statistics.median(steps) * 1e3:8.2f}")
    print(f"(medians over {args.rounds} rounds x <= {args.tokens} greedy decode steps; '+ per token' = mask fill + "
          "advance + applying the mask, and its share of a plain step; 'step' is the whole constrained step, "
          "as noisy as the machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
