"""What sealing peer frames costs (a swarm secret): per frame in process, and over loopback side by side.

    python benchmarks/sealed_links.py [--rounds 8] [--small 300] [--large 10]

1. In process, no sockets: encode + parse one frame, plain vs sealed (seal_frame /
   SealedFrameParser: AES-GCM, one call for a small frame), for a decode step's
   hidden states (1 x 576 float32, SmolLM2) and prefill chunks of 128 and 2048 tokens.
2. Over loopback: two echo nodes in child processes, one open and one with a secret,
   each a node's real data path (listener, lane, MLX thread, a typed message and an
   mx.array decoded on arrival). Batches alternate open / sealed, so the machine's
   drift stays out of the ratio: a decode step's round trip (there and back: two
   sealed frames each way's cost) and a 4.7 MB prefill frame there with a token back.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import queue
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

from swarm.engine.worker import MlxWorker  # noqa: E402
from swarm.transport.arrays import encode_array  # noqa: E402
from swarm.transport.frames import FrameParser, encode_frame  # noqa: E402
from swarm.transport.lane import DataLane  # noqa: E402
from swarm.transport.link_crypto import FrameOpener, FrameSealer, stretch_secret  # noqa: E402
from swarm.transport.links import PeerLinks  # noqa: E402
from swarm.transport.listener import PeerListener  # noqa: E402
from swarm.transport.messages import Forward, Token  # noqa: E402
from swarm.transport.sealed_frames import SealedFrameParser, seal_frame  # noqa: E402

HOST = "127.0.0.1"
SWARM = "bench"
HIDDEN = 576
MAX_PAYLOAD = 64 * 1024 * 1024
SECRET = "benchmark secret, not a real one"
# (the same script runs on builds from before seal_frame could reuse its buffers)
REUSE = {"reuse": True} if "reuse" in inspect.signature(seal_frame).parameters else {}


def forward(tokens: int) -> Forward:
    dtype, shape, data = encode_array(mx.random.normal((1, tokens, HIDDEN)))
    return Forward("r-bench", "p", 5, 10, "entry", None, dtype, tuple(shape), data)


def in_process_table() -> None:
    key = b"k" * 32
    print(f"{'frame':<34} {'plain us':>9} {'sealed us':>10} {'extra us':>9} {'sealed MB/s':>12}")
    for tokens, n in ((1, 20000), (128, 2000), (2048, 60)):
        header, payload = forward(tokens).to_frame()
        nbytes = memoryview(payload).nbytes

        def plain() -> None:
            FrameParser(MAX_PAYLOAD).feed(b"".join(bytes(p) for p in encode_frame(header, payload)))

        sealer, opener = FrameSealer(key), FrameOpener(key)
        parser = SealedFrameParser(opener, MAX_PAYLOAD)

        def sealed() -> None:  # as a node's data link does: sealed into kept buffers, read in one piece
            parser.feed(b"".join(bytes(p) for p in seal_frame(sealer, header, payload, **REUSE)))

        best = {}
        for name, fn in (("plain", plain), ("sealed", sealed)):
            fn()
            times = []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(n):
                    fn()
                times.append((time.perf_counter() - t) / n)
            best[name] = min(times)
        label = f"{tokens} x {HIDDEN} float32 ({nbytes / 1e3:.1f} kB)"
        print(f"{label:<34} {best['plain'] * 1e6:9.1f} {best['sealed'] * 1e6:10.1f} "
              f"{(best['sealed'] - best['plain']) * 1e6:9.1f} {nbytes / best['sealed'] / 1e6:12.0f}")


async def run_echo(secret: bool) -> None:
    """Child: a node's data path; decode-sized arrays go back whole, big ones are answered with a token."""
    key = stretch_secret(SECRET) if secret else None
    worker = MlxWorker()
    links = PeerLinks("echo")
    lane = DataLane("echo", SWARM, links, worker.watch, worker.post, lambda node_id: ("0.0.0.0", 0),
                    max_payload=MAX_PAYLOAD, key=key, writes=worker)

    def echo(sender: str, message) -> None:
        a = message.array()
        mx.eval(a)
        lane.mlx_send(sender, message if a.shape[1] == 1 else Token("bench", "p", 1, a.shape[1]))

    lane.serve(echo)
    listener = PeerListener("echo", SWARM, HOST, 0, links, lane, None, max_payload=MAX_PAYLOAD, key=key)
    await listener.start()
    print(listener.port, flush=True)
    await asyncio.Event().wait()


class Client:
    def __init__(self, secret: bool) -> None:
        self.child = subprocess.Popen([sys.executable, __file__, "--echo"] + (["--secret"] if secret else []),
                                      stdout=subprocess.PIPE, text=True)
        port = int(self.child.stdout.readline())
        self.worker = MlxWorker()
        self.replies: queue.Queue = queue.Queue()
        self.lane = DataLane("bench", SWARM, PeerLinks("bench"), self.worker.watch, self.worker.post,
                             {"echo": (HOST, port)}.get, max_payload=MAX_PAYLOAD,
                             key=stretch_secret(SECRET) if secret else None, writes=self.worker)
        self.lane.serve(lambda sender, message: self.replies.put(message))

    def exchange(self, message: Forward) -> float:
        start = time.perf_counter()
        self.worker.submit(self.lane.mlx_send, "echo", message).result()
        reply = self.replies.get()
        if isinstance(reply, Forward):
            mx.eval(reply.array())
        return time.perf_counter() - start

    def close(self) -> None:
        self.worker.submit(self.lane.mlx_close).result()
        self.worker.close()
        self.child.kill()
        self.child.wait()


def loopback_table(rounds: int, small: int, large: int) -> None:
    step, prefill = forward(1), forward(2048)
    clients = {"open": Client(False), "sealed": Client(True)}
    try:
        for c in clients.values():  # connect, warm up
            for _ in range(50):
                c.exchange(step)
            c.exchange(prefill)
        rows = []
        print(f"\n{'round':>5} {'open step':>10} {'sealed':>8} {'open 4.7MB':>11} {'sealed':>8}   (ms, medians)")
        for r in range(rounds):
            row = []
            for kind in ("open", "sealed"):
                row.append(statistics.median(clients[kind].exchange(step) for _ in range(small)))
            for kind in ("open", "sealed"):
                row.append(statistics.median(clients[kind].exchange(prefill) for _ in range(large)))
            rows.append(row)
            print(f"{r + 1:>5} {row[0] * 1e3:10.3f} {row[1] * 1e3:8.3f} {row[2] * 1e3:11.2f} {row[3] * 1e3:8.2f}",
                  flush=True)
        med = [statistics.median(col) for col in zip(*rows)]
        step_extra = statistics.median(s - o for o, s, _, _ in rows)
        big_extra = statistics.median(s - o for _, _, o, s in rows)
        mb = memoryview(prefill.payload).nbytes / 1e6
        print(f"\ndecode step round trip: open {med[0] * 1e3:.3f} ms, sealed {med[1] * 1e3:.3f} ms, "
              f"+{step_extra * 1e3:.3f} ms per round trip (two frames: +{step_extra / 2 * 1e3:.3f} ms per hop), "
              f"ratio {med[1] / med[0]:.2f}")
        print(f"{mb:.1f} MB prefill frame there + token back: open {med[2] * 1e3:.2f} ms, sealed {med[3] * 1e3:.2f} ms, "
              f"+{big_extra * 1e3:.2f} ms; {mb / med[2]:.0f} vs {mb / med[3]:.0f} MB/s, ratio {med[3] / med[2]:.2f}")
    finally:
        for c in clients.values():
            c.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--small", type=int, default=300, help="decode-step round trips per batch")
    p.add_argument("--large", type=int, default=10, help="prefill frames per batch")
    p.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--secret", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.echo:
        asyncio.run(run_echo(args.secret))
        return
    in_process_table()
    loopback_table(args.rounds, args.small, args.large)


if __name__ == "__main__":
    main()
