"""Peer transport over loopback: decode-step latency and prefill-sized throughput.

    python benchmarks/transport_roundtrip.py [--small 2000] [--large 50] [--idle-ms 25,60]

An echo node runs in a child process (its own interpreter, event loop and MLX
thread, as a real peer would); both ends use the node's data lane, on one
connection. Every frame is decoded into a typed message and an mx.array on
arrival, so the numbers include that, not only the socket.

The idle rows repeat the small round trip after both ends slept for a while, as
pipeline stages do between decode steps (a stage waits while the others compute).
On a VM whose idle vCPUs halt, waking a sleeping process costs far more than the
socket itself; that is the floor under the swarm's per-hop decode overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

import queue  # noqa: E402

from swarm.engine.worker import MlxWorker  # noqa: E402
from swarm.transport.arrays import encode_array  # noqa: E402
from swarm.transport.lane import DataLane  # noqa: E402
from swarm.transport.links import PeerLinks  # noqa: E402
from swarm.transport.listener import PeerListener  # noqa: E402
from swarm.transport.messages import Forward, Token  # noqa: E402

HOST = "127.0.0.1"
SWARM = "bench"
SMALL_SHAPE = (1, 1, 576)
LARGE_SHAPE = (1, 2048, 576)
MAX_PAYLOAD = 64 * 1024 * 1024


def _described(a: mx.array):
    dtype, shape, data = encode_array(a)
    return dtype, tuple(shape), data


async def run_echo() -> None:
    """Child: a node's data path. Every array is decoded on arrival; a decode-step-sized one is sent
    back whole on the same connection, a large one answered with a token (an ack)."""
    worker = MlxWorker()
    links = PeerLinks("echo")
    lane = DataLane("echo", SWARM, links, worker.watch, worker.post, lambda node_id: ("0.0.0.0", 0),
                    max_payload=MAX_PAYLOAD, writes=worker)

    def echo(sender: str, message) -> None:  # on the MLX thread, as a stage would
        a = message.array()
        mx.eval(a)
        if a.shape[1] == 1:
            lane.mlx_send(sender, message)
        else:
            lane.mlx_send(sender, Token("bench", "p", 1, a.shape[1]))

    lane.serve(echo)
    listener = PeerListener("echo", SWARM, HOST, 0, links, lane, lambda: None, max_payload=MAX_PAYLOAD)
    await listener.start()
    print(listener.port, flush=True)
    await asyncio.Event().wait()


async def run_bench(small: int, large: int, idle_ms: list[float]) -> None:
    child = subprocess.Popen([sys.executable, __file__, "--echo"], stdout=subprocess.PIPE, text=True)
    worker = MlxWorker()
    try:
        echo_port = int(child.stdout.readline())
        replies: queue.Queue = queue.Queue()
        lane = DataLane("bench", SWARM, PeerLinks("bench"), worker.watch, worker.post,
                        {"echo": (HOST, echo_port)}.get, max_payload=MAX_PAYLOAD, writes=worker)
        lane.serve(lambda sender, message: replies.put(message))

        def exchange(a: mx.array) -> float:
            start = time.perf_counter()
            worker.submit(lane.mlx_send, "echo", Forward("bench", "p", 0, 1, "bench", None, *_described(a))).result()
            message = replies.get()
            if isinstance(message, Forward):
                mx.eval(message.array())
            return time.perf_counter() - start

        x = mx.random.normal(SMALL_SHAPE)
        big = mx.random.normal(LARGE_SHAPE)
        mx.eval(x, big)
        for _ in range(50):  # connect, warm up
            exchange(x)
        exchange(big)

        small_times = [exchange(x) for _ in range(small)]
        idle_times = {}
        for gap in idle_ms:
            idle_times[gap] = []
            for _ in range(max(20, min(small, int(4000 / max(gap, 1))))):  # ~4 s per gap
                time.sleep(gap / 1e3)  # the whole process idle, as a stage waiting for its turn
                idle_times[gap].append(exchange(x))
        large_times = [exchange(big) for _ in range(large)]

        start = time.perf_counter()  # pipelined: all sends first, then all acks
        bulk = Forward("bench", "p", 0, 1, "bench", None, *_described(big))
        for _ in range(large):
            worker.submit(lane.mlx_send, "echo", bulk).result()
        for _ in range(large):
            replies.get()
        pipelined = time.perf_counter() - start
        worker.submit(lane.mlx_close).result()
    finally:
        worker.close()
        child.kill()
        child.wait()

    mb = big.nbytes / 1e6

    def pct(values: list[float], q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1e3

    print(f"{'measurement':<46} {'p50':>9} {'p99':>9} {'mean':>9}")
    print(f"{'round trip, (1,1,576) f32 there and back (ms)':<46} "
          f"{pct(small_times, 0.5):9.3f} {pct(small_times, 0.99):9.3f} {statistics.mean(small_times) * 1e3:9.3f}")
    for gap, times in idle_times.items():
        print(f"{f'  the same after {gap:g} ms idle (ms)':<46} "
              f"{pct(times, 0.5):9.3f} {pct(times, 0.99):9.3f} {statistics.mean(times) * 1e3:9.3f}")
    print(f"{f'(1,2048,576) f32 {mb:.1f} MB there, ack back (ms)':<46} "
          f"{pct(large_times, 0.5):9.3f} {pct(large_times, 0.99):9.3f} {statistics.mean(large_times) * 1e3:9.3f}")
    print(f"{'  one at a time, throughput (MB/s)':<46} {mb / (pct(large_times, 0.5) / 1e3):9.0f}")
    print(f"{f'  {large} pipelined, throughput (MB/s)':<46} {large * mb / pipelined:9.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=2000, help="decode-step round trips")
    parser.add_argument("--large", type=int, default=50, help="prefill-sized frames")
    parser.add_argument("--idle-ms", default="25,60", help="idle gaps before extra small round trips, comma-separated")
    parser.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    idle = [float(v) for v in args.idle_ms.split(",") if v.strip()]
    asyncio.run(run_echo() if args.echo else run_bench(args.small, args.large, idle))


if __name__ == "__main__":
    main()
