"""Peer transport over loopback: decode-step latency and prefill-sized throughput.

    python benchmarks/transport_roundtrip.py [--small 2000] [--large 50] [--idle-ms 25,60]

An echo node runs in a child process (its own interpreter and event loop, as
a real peer would). Every frame is decoded into an mx.array on arrival, so
the numbers include array encode/decode, not only the socket.

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

from swarm.transport import Frame, TcpTransport, array_frame, frame_array  # noqa: E402

HOST = "127.0.0.1"
SWARM = "bench"
SMALL_SHAPE = (1, 1, 576)
LARGE_SHAPE = (1, 2048, 576)


async def run_echo() -> None:
    """Child: decode every array; echo "ping"s back whole, answer "bulk" with a tiny ack."""
    queue: asyncio.Queue[Frame] = asyncio.Queue()

    async def enqueue(sender: str, frame: Frame) -> None:
        queue.put_nowait(frame)

    transport = TcpTransport("echo", SWARM, HOST, 0)
    await transport.start(enqueue)
    print(transport.port, flush=True)
    while True:
        frame = await queue.get()
        a = frame_array(frame)
        back = (HOST, frame.header["reply_port"])
        if frame.type == "ping":
            await transport.send("bench", back, *array_frame({"t": "pong"}, a))
        else:
            await transport.send("bench", back, {"t": "ack", "n": a.size})


async def run_bench(small: int, large: int, idle_ms: list[float]) -> None:
    child = subprocess.Popen([sys.executable, __file__, "--echo"], stdout=subprocess.PIPE, text=True)
    try:
        echo_port = int(child.stdout.readline())
        replies: asyncio.Queue[Frame] = asyncio.Queue()

        async def enqueue(sender: str, frame: Frame) -> None:
            replies.put_nowait(frame)

        transport = TcpTransport("bench", SWARM, HOST, 0, max_payload=64 * 1024 * 1024)
        await transport.start(enqueue)
        echo = ("echo", (HOST, echo_port))
        reply_port = {"reply_port": transport.port}

        async def exchange(t: str, a: mx.array) -> float:
            start = time.perf_counter()
            await transport.send(*echo, *array_frame({"t": t, **reply_port}, a))
            frame = await replies.get()
            if frame.type == "pong":
                mx.eval(frame_array(frame))
            return time.perf_counter() - start

        x = mx.random.normal(SMALL_SHAPE)
        big = mx.random.normal(LARGE_SHAPE)
        mx.eval(x, big)
        for _ in range(50):  # connect both ways, warm up
            await exchange("ping", x)
        await exchange("bulk", big)

        small_times = [await exchange("ping", x) for _ in range(small)]
        idle_times = {}
        for gap in idle_ms:
            idle_times[gap] = []
            for _ in range(max(20, min(small, int(4000 / max(gap, 1))))):  # ~4 s per gap
                time.sleep(gap / 1e3)  # block the whole process, as a stage waiting for its turn
                idle_times[gap].append(await exchange("ping", x))
        large_times = [await exchange("bulk", big) for _ in range(large)]

        start = time.perf_counter()  # pipelined: all sends first, then all acks
        for _ in range(large):
            await transport.send(*echo, *array_frame({"t": "bulk", **reply_port}, big))
        for _ in range(large):
            await replies.get()
        pipelined = time.perf_counter() - start
        await transport.stop()
    finally:
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
