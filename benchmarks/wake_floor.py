"""The floor under a hop on this machine: waking an idle process or thread, and running cold code.

    python benchmarks/wake_floor.py [--samples 200] [--idle-ms 20]

A decode hop wakes the next node, which has been idle while the other stages
computed. This measures, with nothing of swarm in the way:
  - an idle process woken by 2.4 KB arriving on a loopback TCP socket (the hop's socket);
  - an idle thread woken by threading.Event (the node's hand-offs to and from its MLX thread);
  - the Python a hop runs (build a header, pack a frame) right after idling, against the same
    code run again at once (warm).
On a VM an idle vCPU halts, and waking it costs a hypervisor round trip; the
caches it comes back to are cold. Everything a hop does pays both.
Only loopback and a socket pair between this process and its child are used.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.transport.frames import encode_frame  # noqa: E402

PAYLOAD = b"x" * 2304  # one float32 hidden state of SmolLM2-135M


def process_wake_us(samples: int, idle_s: float) -> list[float]:
    """Sender's send() to the moment the idle receiving process returns from recv()."""
    server = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(server.getsockname())
    receiver, _ = server.accept()
    server.close()
    for s in (sender, receiver):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child receives and reports when it woke, on the monotonic clock both share
        sender.close()
        for _ in range(samples):
            got = 0
            while got < len(PAYLOAD):
                got += len(receiver.recv(65536))
                woke = time.monotonic_ns()
            os.write(report_w, woke.to_bytes(8, "little"))
        os._exit(0)
    receiver.close()
    out = []
    for _ in range(samples):
        time.sleep(idle_s)
        t0 = time.monotonic_ns()
        sender.sendall(PAYLOAD)
        woke = int.from_bytes(os.read(report_r, 8), "little")
        out.append((woke - t0) / 1e3)
    os.waitpid(pid, 0)
    sender.close()
    return out


def thread_wake_us(samples: int, idle_s: float) -> list[float]:
    event, sent_at, out = threading.Event(), [0], []

    def waiter() -> None:
        for _ in range(samples):
            event.wait()
            out.append((time.monotonic_ns() - sent_at[0]) / 1e3)
            event.clear()

    thread = threading.Thread(target=waiter)
    thread.start()
    for _ in range(samples):
        time.sleep(idle_s)
        sent_at[0] = time.monotonic_ns()
        event.set()
        while event.is_set():  # until the waiter has taken it
            time.sleep(0)
    thread.join()
    return out


def hop_code(pos: int) -> None:
    header = {"t": "fwd", "rid": "0123456789abcdef", "plan": "0123456789ab", "pos": pos, "start": 10,
              "entry": "node-0", "sampling": {"temperature": 0.0}, "cu": 12345, "dtype": "float32",
              "shape": [1, 1, 576]}
    encode_frame(header, memoryview(PAYLOAD))


def cold_code_us(samples: int, idle_s: float) -> tuple[list[float], list[float]]:
    cold, warm = [], []
    for i in range(samples):
        time.sleep(idle_s)
        t0 = time.perf_counter()
        hop_code(i)
        t1 = time.perf_counter()
        hop_code(i)
        t2 = time.perf_counter()
        cold.append((t1 - t0) * 1e6)
        warm.append((t2 - t1) * 1e6)
    return cold, warm


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--idle-ms", type=float, default=20.0, help="idle time before each sample (a stage's compute)")
    args = p.parse_args()
    idle = args.idle_ms / 1e3
    cold, warm = cold_code_us(args.samples, idle)
    rows = [
        ("idle process woken by a loopback TCP frame", process_wake_us(args.samples, idle)),
        ("idle thread woken by threading.Event", thread_wake_us(args.samples, idle)),
        ("a hop's header + frame packing, after idling", cold),
        ("the same code, run again at once (warm)", warm),
    ]
    print(f"{os.cpu_count()} CPUs, {args.samples} samples, {args.idle_ms:g} ms idle before each")
    print("| what | median µs | p10 µs | p90 µs |")
    print("|---|---:|---:|---:|")
    for name, values in rows:
        values = sorted(values)
        n = len(values)
        print(f"| {name} | {statistics.median(values):.0f} | {values[n // 10]:.0f} | {values[n * 9 // 10]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
