"""How low can a hop go here? The leanest Python pipeline we can write, measured like swarm's hops.

    python benchmarks/lean_pipeline.py [--stages 3] [--tokens 48] [--rounds 3] [--model DIR|GGUF]

Starts one process per stage on loopback, each holding its layers of the model
(swarm's own ShardRunner), and runs one greedy stream through them. Nothing of the
swarm's node is in the way: no event loop, no router, no MLX thread hand-off.
Each process blocks in recv() on its input socket, decodes swarm's frame format
(msgpack header + raw bytes), runs its shard and writes the result to the next
stage with one sendmsg(). Stage 0 is the entry: it embeds, sends, and waits for
the token from the last stage.

Per-hop overhead is measured as swarm's entry node measures it:
(step wall time - the stages' compute) / hops, with hops = stages. What is left
is the floor of a Python pipeline on this machine: waking an idle process and
running cold code after a forward pass. swarm-bench's "overhead/hop ms" column
is the same quantity for the real node.

Four variants, in alternating rounds of fresh processes: as described; with the
entry's compute on a second thread (one hand-off there and one back, as in a
node, whose event loop owns the request); and both again with glibc's per-thread
cache raised (GLIBC_TUNABLES tcache_count), which keeps the small blocks a
forward pass frees from being merged by the next larger malloc on the hop.
Only loopback is used.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.bench.prompts import PROMPT  # noqa: E402
from swarm.engine.blas import find_optimized_blas, reexec_env  # noqa: E402

_PREFIX = struct.Struct(">II")


def recv_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("peer closed")
        got += k
    return buf


def read_frame(sock: socket.socket):
    import msgpack

    hlen, plen = _PREFIX.unpack(recv_exactly(sock, _PREFIX.size))
    header = msgpack.unpackb(recv_exactly(sock, hlen), raw=False)
    return header, (recv_exactly(sock, plen) if plen else b"")


def send_frame(sock: socket.socket, header: dict, payload=b"") -> None:
    import msgpack

    packed = msgpack.packb(header, use_bin_type=True)
    sock.sendmsg([_PREFIX.pack(len(packed), memoryview(payload).nbytes) + packed, payload])


def run_stage(index: int, k: int, start: int, end: int, model_dir: str, ports: list[int], tokens: int,
              prompt_ids: list[int], handoff: bool) -> None:
    import mlx.core as mx

    from swarm.engine.sampling import SamplingParams
    from swarm.engine.shard import load_shard
    from swarm.engine.shard_runner import ShardRunner
    from swarm.transport.arrays import decode_array, encode_array

    stage = ShardRunner(load_shard(Path(model_dir), start, end, mx.float32))
    server = socket.create_server(("127.0.0.1", ports[index]))
    print("ready", flush=True)
    while True:  # the next stage may not listen yet; connect before accepting, or the ring deadlocks
        try:
            outbound = socket.create_connection(("127.0.0.1", ports[(index + 1) % k]))
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    inbound, _ = server.accept()
    for s in (inbound, outbound):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    greedy = SamplingParams(temperature=0.0)

    def compute(x, pos: int):
        """This stage's forward pass; (what to send, header fields, seconds)."""
        t0 = time.perf_counter()
        out = stage.forward("r", x, pos, greedy)
        if isinstance(out, int):
            return {"tok": out}, b"", time.perf_counter() - t0
        dtype, shape, data = encode_array(out)  # evaluates
        return {"dtype": dtype, "shape": shape}, data, time.perf_counter() - t0

    if index > 0:
        while True:
            try:
                h, payload = read_frame(inbound)
            except ConnectionError:
                return
            x = decode_array(h["dtype"], h["shape"], payload)
            fields, data, took = compute(x, h["pos"])
            send_frame(outbound, {"t": "fwd", "pos": h["pos"], "cu": h["cu"] + round(took * 1e6), **fields}, data)

    # the entry: prefill, then one decode step per token, timed
    if handoff:  # the entry computes on another thread, as a node whose event loop owns the request does
        from concurrent.futures import ThreadPoolExecutor
        pool, plain = ThreadPoolExecutor(1), compute
        compute = lambda x, pos: pool.submit(plain, x, pos).result()  # noqa: E731
    else:
        pool = None
    steps, computes = [], []
    ids, pos = prompt_ids, 0
    for step in range(tokens + 1):
        t0 = time.perf_counter()
        fields, data, took = compute(mx.array([ids], dtype=mx.int32), pos)
        send_frame(outbound, {"t": "fwd", "pos": pos, "cu": round(took * 1e6), **fields}, data)
        h, _ = read_frame(inbound)
        wall = time.perf_counter() - t0
        if step > 0:  # the first is the prefill
            steps.append(wall)
            computes.append(h["cu"] / 1e6)
        pos += len(ids)
        ids = [h["tok"]]
    outbound.close()
    if pool is not None:
        pool.shutdown()
    overhead = sorted((w - c) / k * 1e3 for w, c in zip(steps, computes))
    print(f"result {statistics.median(steps) * 1e3:.2f} {statistics.median(computes) * 1e3:.2f} "
          f"{statistics.median(overhead):.3f} {overhead[len(overhead) // 10]:.3f} "
          f"{overhead[len(overhead) * 9 // 10]:.3f}", flush=True)


TCACHE = "glibc.malloc.tcache_count=65535"  # small frees stay in the thread's cache, never merged
VARIANTS = [  # (name, entry hands compute to another thread, extra environment)
    ("lean", False, {}),
    ("lean, entry hands off to a compute thread", True, {}),
    ("lean + glibc tcache", False, {"GLIBC_TUNABLES": TCACHE}),
    ("lean + glibc tcache, entry hands off", True, {"GLIBC_TUNABLES": TCACHE}),
]


def run_pipeline(script_args: list[str], k: int, bounds: list[int], prompt_ids: list[int],
                 env: dict[str, str]) -> list[float]:
    """One pipeline of k fresh processes; the entry's (step ms, compute ms, overhead/hop ms, p10, p90)."""
    ports = []
    for _ in range(k):
        with socket.create_server(("127.0.0.1", 0)) as s:
            ports.append(s.getsockname()[1])
    procs = []
    try:
        for i in range(k):
            cmd = [sys.executable, __file__, *script_args, "--stage", str(i), "--bounds", f"{bounds[i]},{bounds[i + 1]}",
                   "--ports", ",".join(map(str, ports)), "--prompt-ids", ",".join(map(str, prompt_ids))]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("a stage failed to start")
        line = procs[0].stdout.readline().split()  # the others exit when their input closes
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    if not line or line[0] != "result":
        raise SystemExit("the pipeline did not finish")
    return [float(v) for v in line[1:]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds over the variants")
    p.add_argument("--model", default=None)
    p.add_argument("--stage", type=int, default=None, help=argparse.SUPPRESS)  # a child process
    p.add_argument("--bounds", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ports", default=None, help=argparse.SUPPRESS)
    p.add_argument("--prompt-ids", default=None, help=argparse.SUPPRESS)
    p.add_argument("--handoff", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.stage is not None:
        start, end = (int(v) for v in args.bounds.split(","))
        run_stage(args.stage, args.stages, start, end, args.model, [int(v) for v in args.ports.split(",")],
                  args.tokens, [int(v) for v in args.prompt_ids.split(",")], args.handoff)
        return 0

    import mlx.core as mx
    from mlx_lm.utils import load_tokenizer

    from swarm.models.resolve import resolve_model

    model = resolve_model(args.model, backend="cpu" if mx.default_device() == mx.cpu else "gpu")
    prompt_ids = list(load_tokenizer(model.path).encode(PROMPT))  # as swarm-bench's prompt
    k = args.stages
    bounds = [round(i * model.n_layers / k) for i in range(k + 1)]
    blas = find_optimized_blas()
    base_env = reexec_env(blas, dict(os.environ)) if blas is not None else dict(os.environ)
    base_env.pop("GLIBC_TUNABLES", None)
    script_args = ["--stages", str(k), "--tokens", str(args.tokens), "--model", str(model.path)]
    results: dict[str, list[list[float]]] = {name: [] for name, _, _ in VARIANTS}
    for _ in range(args.rounds):  # alternate, so drift in the machine hits every variant alike
        for name, handoff, extra in VARIANTS:
            results[name].append(run_pipeline(script_args + ["--handoff"] * handoff, k, bounds, prompt_ids,
                                              {**base_env, **extra}))
    print(f"{model.model_id}, {k} stages {bounds}, one greedy stream of {args.tokens} tokens, "
          f"{args.rounds} alternating rounds (medians of the rounds' medians), BLAS: {blas or 'bundled'}")
    print("| pipeline | decode step ms | stages' compute ms | overhead/hop ms | overhead/hop per round |")
    print("|---|---:|---:|---:|---|")
    for name, rounds in results.items():
        step, compute, hop = (statistics.median(r[i] for r in rounds) for i in range(3))
        per_round = " ".join(f"{r[2]:.2f}" for r in rounds)
        print(f"| {name} | {step:.1f} | {compute:.1f} | {hop:.2f} | {per_round} |")
    print("overhead/hop = (step wall time - stages' compute) / hops, hops = stages (entry = stage 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
