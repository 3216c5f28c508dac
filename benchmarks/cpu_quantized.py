"""Quantized weights on this machine: kept quantized, or dequantized at load? Prints a table.

    python benchmarks/cpu_quantized.py [--model DIR] [--tokens 32] [--rounds 3]

The default model (SmolLM2-135M) is cast to bfloat16 and quantized with
mlx-lm's own quantize_model to 4 and 8 bits (group 64), as mlx-community's
checkpoints are (bfloat16 scales, norms and unquantized weights). Each is then
loaded by the swarm engine as a whole-model shard three ways: as stored (a
node's `--dtype native`), quantized weights kept with every float (scales,
norms) in float32, and dequantized to float32 at load
(`load_shard(..., dequantize_layers=True)`). Decode tok/s is a greedy stream
of `--tokens` after a 32-token prompt (the prompt's prefill is timed too);
variants run in alternating rounds so the machine's drift hits all of them
alike; the median per variant is shown.
The node's default (`--dequantize no`: packed weights and their scales as stored,
other floats in float32) and its `--dequantize yes` follow this table: see docs/performance.md.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.engine.blas import blas_in_use  # noqa: E402
from swarm.engine.quantized import cast_floats, weights_run_as  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402
from swarm.engine.shard_runner import ShardRunner  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402

PROMPT = [(i * 97) % 4000 + 100 for i in range(32)]


def quantized_copy(src: Path, out: Path, bits: int) -> Path:
    import json
    model, config = load_model(src)
    model.apply(lambda x: x.astype(mx.bfloat16) if mx.issubdtype(x.dtype, mx.floating) else x)
    model, config = quantize_model(model, config, 64, bits)
    save_model(out, model)
    save_config(config, out / "config.json")
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            (out / f.name).write_bytes(f.read_bytes())
    json.loads((out / "config.json").read_text())
    return out


def decode_tps(model_dir: Path, how: str, tokens: int) -> tuple[float, float, int, str]:
    if how == "float32, float32 scales":
        shard = load_shard(model_dir, 0, None, None)
        cast_floats(shard.model, mx.float32, scales=True)
        mx.eval(shard.parameters())
        shard.weights_run_as = weights_run_as(shard.model)
    else:
        dtype = None if how == "native" else mx.float32
        shard = load_shard(model_dir, 0, None, dtype, dequantize_layers=how == "dequantize")
    runner = ShardRunner(shard)
    start = time.perf_counter()
    token = int(mx.argmax(runner.forward("b", mx.array([PROMPT]), 0)))
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(tokens):
        token = int(mx.argmax(runner.forward("b", mx.array([[token]]), len(PROMPT) + i)))
    tps = tokens / (time.perf_counter() - start)
    out = tps, prefill, shard.weight_bytes(), shard.weights_run_as
    del runner, shard
    gc.collect()
    mx.clear_cache()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="a float mlx-lm model dir (default: SmolLM2-135M)")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    src = args.model or resolve_model(None).path
    with tempfile.TemporaryDirectory() as tmp:
        variants = [("float32 (as converted)", src, "float32")]
        for bits in (4, 8):
            q = quantized_copy(src, Path(tmp) / f"q{bits}", bits)
            variants += [(f"{bits}-bit, as stored (bfloat16)", q, "native"),
                         (f"{bits}-bit, floats to float32, scales as stored", q, "float32"),
                         (f"{bits}-bit, floats and scales to float32", q, "float32, float32 scales"),
                         (f"{bits}-bit, dequantized to float32", q, "dequantize")]
        results: dict[str, list] = {name: [] for name, _, _ in variants}
        for _ in range(args.rounds):
            for name, path, deq in variants:
                results[name].append(decode_tps(path, deq, args.tokens))
                print(f"  {name}: {results[name][-1][0]:.2f} tok/s, prefill {results[name][-1][1]:.2f} s",
                      file=sys.stderr, flush=True)
    base = statistics.median(r[0] for r in results[variants[0][0]])
    print(f"\nBLAS: {blas_in_use()}; {args.tokens} tokens after a {len(PROMPT)}-token prompt, "
          f"median of {args.rounds} alternating rounds\n")
    base_prefill = statistics.median(r[1] for r in results[variants[0][0]])
    print(f"| weights | run as | resident weights MB | prefill {len(PROMPT)} tokens s | decode tok/s | "
          "decode vs float32 | prefill vs float32 |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, _, _ in variants:
        tps = statistics.median(r[0] for r in results[name])
        prefill = statistics.median(r[1] for r in results[name])
        _, _, nbytes, run_as = results[name][-1]
        print(f"| {name} | {run_as} | {nbytes / 1e6:.0f} | {prefill:.2f} | {tps:.2f} | {tps / base:.2f}x "
              f"| {base_prefill / prefill:.2f}x |")


if __name__ == "__main__":
    main()
