"""Fetching a model's chunks from a peer against a plain TCP copy of the same bytes, on loopback.

    python benchmarks/weights_fetch.py [--model DIR] [--rounds 3]

Two holders run in their own processes, each a node's real peer port (PeerListener,
the "weights" purpose, serve_weights) serving the model's directory: one in an open
swarm, one with a swarm secret (the hello's challenge-response, every frame sealed
with AES-GCM). The fetcher dials each as a node does (handshake.dial_stream) and pulls
every chunk into a fresh sparse copy, hashing each as it is written (held only if it
checks out). The baseline is the leanest copy there is: the same files sent raw over one TCP connection
(sendfile) and written to disk, nothing checked. The three run one after the other in
each round, in reverse order every other round (so none always runs first), and the
1-minute load is printed before and after. Prints one row per round and the median
ratios (goal: at least 0.5x), then the CPU seconds each path spent per GB moved (both
ends: the sending process and this one), which load disturbs less than the rates.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.engine.worker import MlxWorker  # noqa: E402
from swarm.transport.handshake import dial_stream  # noqa: E402
from swarm.transport.lane import DataLane  # noqa: E402
from swarm.transport.link_crypto import stretch_secret  # noqa: E402
from swarm.transport.link_handshake import LinkAuth  # noqa: E402
from swarm.transport.links import PeerLinks  # noqa: E402
from swarm.transport.listener import PeerListener  # noqa: E402
from swarm.models.manifest import build_manifest, model_files  # noqa: E402
from swarm.weights.store import ChunkStore  # noqa: E402
from swarm.weights.transfer import WEIGHTS_MAX_PAYLOAD, WEIGHTS_PURPOSE, WeightFetch, serve_weights  # noqa: E402

SWARM, SECRET = "bench", "benchmark secret, not a real one"


def _holder(model_dir: str, port_out, secret: bool) -> None:
    async def main():
        store = ChunkStore.complete(Path(model_dir), build_manifest(Path(model_dir)))
        key = stretch_secret(SECRET) if secret else None
        worker, links = MlxWorker(), PeerLinks("holder")
        lane = DataLane("holder", SWARM, links, worker.watch, worker.post, lambda peer: None, key=key,
                        writes=worker)
        listener = PeerListener("holder", SWARM, "127.0.0.1", 0, links, lane, None, key=key)
        listener.serve_purpose(WEIGHTS_PURPOSE, lambda link: serve_weights(link, store))
        await listener.start()
        port_out.send(listener.port)
        await asyncio.Event().wait()
    asyncio.run(main())


def _raw_sender(model_dir: str, port_out) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port_out.send(srv.getsockname()[1])
    while True:
        conn, _ = srv.accept()
        with conn:
            for path in model_files(Path(model_dir)):
                with open(path, "rb") as f:
                    conn.sendfile(f)


def _start(target, model_dir: str, *args) -> tuple[multiprocessing.Process, int]:
    recv, send = multiprocessing.Pipe(duplex=False)
    proc = multiprocessing.Process(target=target, args=(model_dir, send, *args), daemon=True)
    proc.start()
    return proc, recv.recv()


def _cpu_seconds(pid: int) -> float:
    """CPU time of process `pid` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raw_copy(port: int, total: int, out_dir: Path) -> float:
    t0 = time.perf_counter()
    buf = bytearray(4 * 1024 * 1024)
    with socket.create_connection(("127.0.0.1", port)) as s, open(out_dir / "raw.bin", "wb") as out:
        left = total
        while left:
            n = s.recv_into(buf, min(len(buf), left))
            if not n:
                raise RuntimeError("sender closed early")
            out.write(memoryview(buf)[:n])
            left -= n
    return time.perf_counter() - t0


async def fetch(port: int, manifest, out_dir: Path, secret: bool) -> tuple[float, ChunkStore]:
    auth = LinkAuth("fetcher", SWARM, stretch_secret(SECRET) if secret else None)

    async def open_link(_name):
        return await dial_stream(("127.0.0.1", port), auth, WEIGHTS_PURPOSE, max_payload=WEIGHTS_MAX_PAYLOAD)

    store = ChunkStore.partial(out_dir / "fetched", manifest)
    t0 = time.perf_counter()
    await WeightFetch(store, list(manifest.chunks), open_link, lambda: ["holder"]).run()
    return time.perf_counter() - t0, store  # its record is synced in the background (wait_saved)


def parse_args(description: str, rounds: int) -> argparse.Namespace:
    """--model (the built-in model's directory when not given) and --rounds."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the built-in model)")
    p.add_argument("--rounds", type=int, default=rounds)
    args = p.parse_args()
    if args.model is None:
        from swarm.models.resolve import resolve_model
        args.model = resolve_model(None).path
    return args


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], rounds=3)
    manifest = build_manifest(args.model)
    total = manifest.total_bytes
    open_holder, open_port = _start(_holder, str(args.model), False)
    sealed_holder, sealed_port = _start(_holder, str(args.model), True)
    sender, raw_port = _start(_raw_sender, str(args.model))
    print(f"{args.model}: {total / 1e6:.0f} MB in {len(manifest.chunks)} chunks; load {os.getloadavg()[0]:.1f}")
    print("| round | plain TCP copy MB/s | fetch, open swarm MB/s | ratio | fetch, secret (sealed) MB/s | ratio |\n"
          "|---:|---:|---:|---:|---:|---:|")
    open_ratios, sealed_ratios = [], []
    try:
        runs = {"raw": lambda out: (raw_copy(raw_port, total, out), None),
                "open": lambda out: asyncio.run(fetch(open_port, manifest, out, False)),
                "sealed": lambda out: asyncio.run(fetch(sealed_port, manifest, out, True))}
        senders = {"raw": sender.pid, "open": open_holder.pid, "sealed": sealed_holder.pid}
        cpu_per_gb: dict[str, list[float]] = {name: [] for name in runs}
        with tempfile.TemporaryDirectory() as tmp:  # warm-up, not counted: the first copy of a run read ~2.5x slower
            runs["raw"](Path(tmp))
        for i in range(args.rounds):
            seconds = {}
            for name in (list(runs) if i % 2 == 0 else list(reversed(runs))):
                with tempfile.TemporaryDirectory() as tmp:
                    os.sync()  # each path starts with no other path's writeback in flight (not timed)
                    cpu = _cpu_seconds(senders[name]) + _own_cpu_seconds()
                    seconds[name], store = runs[name](Path(tmp))
                    cpu_per_gb[name].append((_cpu_seconds(senders[name]) + _own_cpu_seconds() - cpu) / total * 1e9)
                    if store is not None:  # the disk catches up, as it does after the copy (not counted in either)
                        store.wait_saved()
            raw_s, open_s, sealed_s = seconds["raw"], seconds["open"], seconds["sealed"]
            open_ratios.append(raw_s / open_s)
            sealed_ratios.append(raw_s / sealed_s)
            print(f"| {i + 1} | {total / raw_s / 1e6:.0f} | {total / open_s / 1e6:.0f} | {open_ratios[-1]:.2f}x "
                  f"| {total / sealed_s / 1e6:.0f} | {sealed_ratios[-1]:.2f}x |")
    finally:
        for proc in (open_holder, sealed_holder, sender):
            proc.terminate()
    print(f"median ratio to a plain TCP copy: open {statistics.median(open_ratios):.2f}x, "
          f"sealed {statistics.median(sealed_ratios):.2f}x (goal >= 0.5x); load {os.getloadavg()[0]:.1f}")
    cpu = {name: statistics.median(v) for name, v in cpu_per_gb.items()}
    print("median CPU seconds per GB, both ends: " + ", ".join(f"{name} {v:.2f}" for name, v in cpu.items()) +
          f" (the copy's over the fetch's: open {cpu['raw'] / cpu['open']:.2f}x, sealed {cpu['raw'] / cpu['sealed']:.2f}x)")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
