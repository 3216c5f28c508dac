"""mlx-lm's own pipeline parallelism over mx.distributed's ring backend, on localhost.

    python -m swarm.bench.mlx_ring_pipeline [--model DIR] [--ranks 2] [--tokens 64] [--prompt-tokens 128]

Launches N ranks with `mlx.launch --backend ring --hosts 127.0.0.1 -n N` (every
rank local, every socket on 127.0.0.1), runs one fixed greedy generation with
mlx_lm.generate.stream_generate and prints JSON measured on rank 0: time to first
token, prefill and decode tok/s, and the layer split. mlx-lm's pipeline gives
rank 0 the LAST layers and rank N-1 the first; every rank computes the head and
samples (the final hidden state is all_gather'ed), so all ranks emit the same tokens.

Families without mlx-lm pipeline support (llama in mlx-lm 0.32.2, i.e. SmolLM2)
get `_pipeline_llama`, a copy of mlx-lm's qwen2 pipelined forward: the JSON says
"pipeline": "shim" then. The whole run is bounded by --timeout; on expiry the
launcher's process group (all ranks) is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from swarm import environment

LOOPBACK = "127.0.0.1"  # mlx.launch runs a host locally (no ssh) only if it is exactly this
RESULT = "RING_PIPELINE_RESULT "


# ---------------------------------------------------------------- launcher side

def _free_port_run(n: int) -> int:
    """A base port with n consecutive free TCP ports on loopback."""
    for base in range(39000, 60000, 97):
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind((LOOPBACK, base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free loopback port range")


def _launch_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "mlx.launch"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("mlx.launch")
    return [found] if found else [sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()"]


def _blas_env(mode: str) -> list[str]:
    if mode == "off":
        return []
    from swarm.engine.blas import find_optimized_blas
    blas = find_optimized_blas()
    return [f"LD_PRELOAD={blas}"] if blas else []


def launch(args: argparse.Namespace) -> dict:
    port = _free_port_run(args.ranks)
    cmd = [*_launch_cmd(), "--backend", "ring", "--hosts", LOOPBACK, "-n", str(args.ranks),
           "--starting-port", str(port)]
    for e in _blas_env(args.blas):
        cmd += ["--env", e]
    cmd += [sys.executable, "-m", "swarm.bench.mlx_ring_pipeline", "--worker", "--model", str(args.model),
            "--tokens", str(args.tokens), "--prompt-tokens", str(args.prompt_tokens)]
    # Own session: on timeout one killpg reaches mlx.launch, its bash wrappers and every rank.
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        _kill_group(p)
        out, err = p.communicate()
        raise SystemExit(f"timed out after {args.timeout}s\n--- stdout\n{out}\n--- stderr\n{err}")
    finally:
        _kill_group(p)  # stragglers, if mlx.launch exited before a rank
    for line in out.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):]) | {"launch": " ".join(cmd[:9])}
    raise SystemExit(f"no result (exit {p.returncode})\n--- stdout\n{out}\n--- stderr\n{err}")


def _kill_group(p: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        time.sleep(0.5)


# ------------------------------------------------------------------ rank side

def _pipeline_llama(model, group) -> None:
    """Give mlx-lm's llama the pipeline of its qwen2 (send/recv between ranks, all_gather at the end)."""
    import mlx.core as mx
    from mlx_lm.models.base import create_attention_mask
    from mlx_lm.models.pipeline import PipelineMixin

    inner = model.model
    if any(getattr(layer, "use_sliding", False) for layer in inner.layers):
        raise SystemExit("the llama shim does not handle sliding-window layers")

    def call(self, inputs, cache=None, input_embeddings=None):
        h = input_embeddings if input_embeddings is not None else self.embed_tokens(inputs)
        rank, size = self.pipeline_rank, self.pipeline_size
        layers = self.pipeline_layers
        if cache is None:
            cache = [None] * len(layers)
        mask = create_attention_mask(h, cache[0])
        if rank < size - 1:
            h = mx.distributed.recv_like(h, rank + 1)
        for layer, c in zip(layers, cache):
            h = layer(h, mask, cache=c)
        if rank != 0:
            h = mx.distributed.send(h, (rank - 1) % size)
            if cache[-1] is not None:
                cache[-1].keys = mx.depends(cache[-1].keys, h)
        if size > 1:
            h = mx.distributed.all_gather(h)[: h.shape[0]]
        return self.norm(h)

    inner.__class__ = type("PipelinedLlamaModel", (PipelineMixin, type(inner)), {"__call__": call})
    for k, v in dict(pipeline_rank=0, pipeline_size=1, start_idx=0, end_idx=None).items():
        setattr(inner, k, v)
    # Caches must match this rank's layers, not the None placeholders before them.
    model.__class__ = type("PipelinedLlama", (type(model),),
                           {"layers": property(lambda self: self.model.pipeline_layers)})
    inner.pipeline(group)


def _drain(group, size: int) -> None:
    """Finish the forward step stream_generate leaves in flight, then wait for every rank.

    generate_step always schedules the step after the last token it yields, and
    stream_generate abandons it. In a pipeline that step sends, receives and
    all_gathers; a rank that exits early closes its ring sockets under its peers'
    pending step and they fail with "[ring] connection to a peer was lost".
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    mx.synchronize(generation_stream)
    if size > 1:
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=generation_stream))
        mx.synchronize(generation_stream)


def worker(args: argparse.Namespace) -> None:
    import mlx.core as mx
    from mlx_lm.generate import stream_generate
    from mlx_lm.utils import load_model, load_tokenizer

    # mlx.launch gives a 1-rank job an empty hostfile, which the ring backend cannot parse.
    hostfile = environment.MLX_HOSTFILE.get() or ""
    multi = bool(hostfile) and Path(hostfile).read_text().strip() != ""
    group = mx.distributed.init(backend="ring", strict=True) if multi else None
    rank, size = (group.rank(), group.size()) if group is not None else (0, 1)
    path = Path(args.model)
    model, config = load_model(path, lazy=True, strict=False)
    n_layers = len(model.model.layers)
    kind = "none"
    if size > 1:
        if hasattr(model.model, "pipeline"):
            model.model.pipeline(group)
            kind = "mlx-lm"
        elif config.get("model_type") == "llama":
            _pipeline_llama(model, group)
            kind = "shim"
        else:
            raise SystemExit(f"mlx-lm has no pipeline for model_type {config.get('model_type')!r}")
    mx.eval(model.parameters())  # materializes only this rank's layers (the rest were dropped lazily)
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    tokenizer._eos_token_ids = set()  # fixed length: never stop early

    start = getattr(model.model, "start_idx", 0)
    end = getattr(model.model, "end_idx", None) or n_layers
    spans = mx.distributed.all_gather(mx.array([[start, end]]), group=group, stream=mx.cpu) \
        if size > 1 else mx.array([[start, end]])
    split = [{"rank": r, "layers": [int(a), int(b)]} for r, (a, b) in enumerate(spans.tolist())]

    text = "Once upon a time, in a small village by the sea, there lived an old fisherman. "
    ids = tokenizer.encode(text) * (args.prompt_tokens // 8 + 1)
    prompt = ids[: args.prompt_tokens]
    for _ in stream_generate(model, tokenizer, prompt[:8], max_tokens=2):
        pass  # warm-up, in lockstep on every rank  # warm-up, in lockstep on every rank

    t0 = time.perf_counter()
    ttft, tokens, last = None, [], None
    for r in stream_generate(model, tokenizer, prompt, max_tokens=args.tokens):
        if ttft is None:
            ttft = time.perf_counter() - t0
            t_first = time.perf_counter()
        tokens.append(r.token)
        last = r
    t_end = time.perf_counter()
    _drain(group, size)
    if rank == 0:
        from swarm.engine.blas import blas_in_use
        print(RESULT + json.dumps({
            "ranks": size, "pipeline": kind, "model": str(path), "n_layers": n_layers, "split": split,
            "prompt_tokens": len(prompt), "generated_tokens": len(tokens),
            "ttft_s": round(ttft, 4),
            "prefill_tps": round(len(prompt) / ttft, 2),
            "decode_tps": round((len(tokens) - 1) / (t_end - t_first), 2) if len(tokens) > 1 else None,
            "mlx_lm_prompt_tps": round(last.prompt_tps, 2), "mlx_lm_generation_tps": round(last.generation_tps, 2),
            "blas": blas_in_use(), "tokens_head": tokens[:16],
            "loadavg_1m": round(os.getloadavg()[0], 2),  # the machine is shared; >cores means contended
        }), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="mlx-lm model dir (default: the built-in SmolLM2-135M)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64, help="tokens to generate")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--blas", choices=["auto", "off"], default="auto",
                   help="auto: preload the optimized BLAS a swarm node would use (default)")
    p.add_argument("--timeout", type=float, default=900, help="seconds for the whole run")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.model is None:
        from swarm.models.resolve import resolve_model
        args.model = resolve_model(None).path
    print(json.dumps(launch(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
