"""Fetching a model's chunks from a peer against a plain TCP copy of the same bytes, on loopback.

    python benchmarks/weights_fetch.py [--model DIR] [--rounds 3]

The holder runs in its own process (as a peer would), serving the model's
directory; the fetcher pulls every chunk, hashing each before it is written, into
a fresh sparse copy. The baseline is the leanest copy there is: the same files
sent raw over one TCP connection (sendfile) and written to disk, nothing checked.
Prints one row per round and the median ratio (goal: at least 0.5x).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.transport.stream_link import StreamFrameLink  # noqa: E402
from swarm.weights.manifest import build_manifest, model_files  # noqa: E402
from swarm.weights.store import ChunkStore  # noqa: E402
from swarm.weights.transfer import WeightFetch, serve_weights  # noqa: E402


def _holder(model_dir: str, port_out) -> None:
    async def main():
        store = ChunkStore.complete(Path(model_dir), build_manifest(Path(model_dir)))

        async def serve(reader, writer):
            link = StreamFrameLink("fetcher", reader, writer)
            try:
                await serve_weights(link, store)
            except Exception:
                pass
            await link.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port_out.send(server.sockets[0].getsockname()[1])
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


def _start(target, model_dir: str) -> tuple[multiprocessing.Process, int]:
    recv, send = multiprocessing.Pipe(duplex=False)
    proc = multiprocessing.Process(target=target, args=(model_dir, send), daemon=True)
    proc.start()
    return proc, recv.recv()


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


async def fetch(port: int, manifest, out_dir: Path) -> float:
    async def open_link(_name):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return StreamFrameLink("holder", reader, writer)

    store = ChunkStore.partial(out_dir / "fetched", manifest)
    t0 = time.perf_counter()
    await WeightFetch(store, list(manifest.chunks), open_link, lambda: ["holder"]).run()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the built-in model)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.model is None:
        from swarm.models.resolve import resolve_model
        args.model = resolve_model(None).path
    manifest = build_manifest(args.model)
    total = manifest.total_bytes
    holder, holder_port = _start(_holder, str(args.model))
    sender, raw_port = _start(_raw_sender, str(args.model))
    print(f"{args.model}: {total / 1e6:.0f} MB in {len(manifest.chunks)} chunks")
    print("| round | plain TCP copy MB/s | fetch (hashed, verified) MB/s | ratio |\n|---:|---:|---:|---:|")
    ratios = []
    try:
        for i in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                raw_s = raw_copy(raw_port, total, Path(tmp))
            with tempfile.TemporaryDirectory() as tmp:
                fetch_s = asyncio.run(fetch(holder_port, manifest, Path(tmp)))
            ratios.append(raw_s / fetch_s)
            print(f"| {i + 1} | {total / raw_s / 1e6:.0f} | {total / fetch_s / 1e6:.0f} | {ratios[-1]:.2f}x |")
    finally:
        holder.terminate()
        sender.terminate()
    print(f"median ratio: {statistics.median(ratios):.2f}x of a plain TCP copy (goal >= 0.5x)")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
