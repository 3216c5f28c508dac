"""The host's cost per decode step: building one step's graph without evaluating it, for mlx-lm's own model
forward and for the swarm's shard (all layers, and each stage of a 3-way split), then each loop's step time.

    python benchmarks/step_host_cost.py [--model DIR|GGUF] [--steps 64] [--dtype auto]

On a GPU the build is the gap between two steps' kernels unless it overlaps the device's work on the step
before (mlx-lm's generate_step does: it builds step t+1 while step t computes); on a CPU it hides in the
compute. Prints one table: median microseconds to build a step (no evaluation), counted as the building
thread's own CPU time (time.thread_time: a machine busy with other work does not inflate it), and
milliseconds per token (wall) of a synchronous loop (build, evaluate, read the token) and of mlx-lm's
overlapped generate_step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load

from swarm.bench.prompts import PROMPT
from swarm.backend import this_backend
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.models.resolve import resolve_model

GREEDY = SamplingParams(temperature=0.0)


def _median_us(ts: list[float]) -> float:
    return statistics.median(ts) * 1e6


def mlx_lm_rows(model, prompt: mx.array, steps: int) -> list[tuple[str, str]]:
    cache = make_prompt_cache(model)
    y = mx.argmax(model(prompt[None], cache=cache)[:, -1], -1)
    mx.eval(y)
    builds, walls = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        y = mx.argmax(model(y[:, None], cache=cache)[:, -1], -1)
        builds.append(time.thread_time() - c0)
        mx.eval(y)
        y.item()
        walls.append(time.perf_counter() - t0)
    ts = [time.perf_counter() for _ in generate_step(prompt, model, max_tokens=steps)]
    overlapped = (ts[-1] - ts[1]) / (len(ts) - 2)
    return [("mlx-lm model forward + argmax", f"{_median_us(builds[2:]):.0f}"),
            ("mlx-lm synchronous loop, ms/token", f"{statistics.median(walls[2:]) * 1e3:.2f}"),
            ("mlx-lm generate_step (overlapped), ms/token", f"{overlapped * 1e3:.2f}")]


def shard_build_us(shard, x: mx.array, steps: int, last: bool) -> tuple[float, float]:
    """(build of the shard's forward, + the cache arrays the runner evaluates with it), median us."""
    caches = shard.make_caches()
    mx.eval(shard(x if not last or x.ndim == 3 else x, caches), caches.arrays())
    one = x[:, -1:] if x.ndim == 2 else x[:, -1:, :]
    forwards, with_caches = [], []
    for _ in range(steps):
        t0 = time.thread_time()
        out = shard(one, caches)
        if last:
            out = mx.argmax(out)
        t1 = time.thread_time()
        held = caches.arrays()
        t2 = time.thread_time()
        mx.eval(out, held)
        forwards.append(t1 - t0)
        with_caches.append(t2 - t0)
    return _median_us(forwards[2:]), _median_us(with_caches[2:])


def runner_ms(shard, prompt: mx.array, steps: int) -> float:
    """ShardRunner.forward of one request, one step at a time (what a one-node swarm's stage runs)."""
    runner = ShardRunner(shard)
    token = runner.forward("r", prompt[None], 0, GREEDY)
    walls = []
    for pos in range(prompt.shape[0], prompt.shape[0] + steps):
        t0 = time.perf_counter()
        token = runner.forward("r", mx.array([[token]], mx.int32), pos, GREEDY)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls[2:]) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="mlx-lm model dir or .gguf (default: the built-in SmolLM2-135M)")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--dtype", default="auto", choices=["auto", "native", "float32", "float16", "bfloat16"])
    args = p.parse_args()
    backend = this_backend()
    dtype = backend.weights_dtype(args.dtype)
    model_dir = resolve_model(args.model, backend=backend.kind).path
    model, tokenizer = load(str(model_dir))
    if dtype is not None:
        model.apply(lambda a: a.astype(dtype) if mx.issubdtype(a.dtype, mx.floating) else a)
        mx.eval(model.parameters())
    prompt = mx.array(tokenizer.encode(PROMPT))
    rows = mlx_lm_rows(model, prompt, args.steps)
    n_layers = len(model.layers)
    hidden_dtype = model.layers[0].input_layernorm.weight.dtype if hasattr(model.layers[0], "input_layernorm") \
        else mx.float32
    hidden = model.args.hidden_size
    del model

    whole = load_shard(Path(model_dir), 0, None, dtype=dtype)
    fwd, held = shard_build_us(whole, prompt[None], args.steps, last=True)
    rows += [("swarm shard, all layers: forward + argmax", f"{fwd:.0f}"),
             ("  + the cache arrays it evaluates with", f"{held:.0f}"),
             ("swarm ShardRunner.forward, all layers, synchronous, ms/token", f"{runner_ms(whole, prompt, args.steps):.2f}")]
    del whole
    cuts = [0, n_layers // 3, 2 * n_layers // 3, n_layers]
    for i, (start, end) in enumerate(zip(cuts, cuts[1:])):
        shard = load_shard(Path(model_dir), start, end, dtype=dtype)
        x = prompt[None] if start == 0 else mx.random.normal((1, prompt.shape[0], hidden)).astype(hidden_dtype)
        fwd, held = shard_build_us(shard, x, args.steps, last=end == n_layers)
        rows.append((f"swarm shard, stage {i + 1} of 3 (layers {start}-{end}): forward, + caches",
                     f"{fwd:.0f}, {held:.0f}"))
        del shard

    print(f"backend {backend.describe()}, mlx {mx.__version__}, model {model_dir.name} ({n_layers} layers), "
          f"--dtype {args.dtype}, prompt {prompt.shape[0]} tokens, median of {args.steps} steps\n")
    print("| what | host CPU us to build one step (no eval) / wall ms per token |\n|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
