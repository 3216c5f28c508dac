"""Receive, hash and write a model's weights over loopback: whole 16 MiB chunks or a piece at a time, one or two links.

    python benchmarks/weights_receive_pieces.py [ROUNDS] [PIECE_KIB]

No swarm code: a sender process sendfile()s the default model's safetensors in 16 MiB
chunks over 1 or 2 connections (a thread each); the receiver, per connection on a thread
of its own, either receives a whole chunk, hashes it (BLAKE3) and pwrites it ("whole"), or
does the three for each PIECE_KIB piece (default 1024) while the piece is in the core's
cache ("piece"). Prints MB/s per round and the receiver's CPU seconds per GB. What made
the weights fetch receive in pieces on two links per holder (docs/performance.md, issue 16).
"""
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import blake3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swarm.models.resolve import resolve_model  # noqa: E402

MODEL = resolve_model(None).path
files = sorted(p for p in MODEL.iterdir() if p.suffix == ".safetensors")
CH = 16 << 20
chunks = []  # (file, offset, length)
for p in files:
    size = p.stat().st_size
    for off in range(0, size, CH):
        chunks.append((p, off, min(CH, size - off)))
total = sum(c[2] for c in chunks)

def sender(port_out, lanes):
    srv = socket.create_server(("127.0.0.1", 0)); port_out.send(srv.getsockname()[1])
    def serve(conn, part):
        with conn:
            fds = {}
            for (p, off, n) in part:
                fd = fds.get(p) or fds.setdefault(p, os.open(p, os.O_RDONLY))
                sent = 0
                while sent < n:
                    sent += os.sendfile(conn.fileno(), fd, off + sent, n - sent)
    while True:
        conns = [srv.accept()[0] for _ in range(lanes)]
        ts = [threading.Thread(target=serve, args=(c, chunks[i::lanes])) for i, c in enumerate(conns)]
        [t.start() for t in ts]; [t.join() for t in ts]

def recv_into(s, view):
    got = 0
    while got < len(view):
        n = s.recv_into(view[got:], 0, socket.MSG_WAITALL); got += n

def lane_whole(s, part, fds):
    buf = bytearray(CH); mv = memoryview(buf)
    for (p, off, n) in part:
        v = mv[:n]; recv_into(s, v)
        blake3.blake3(v, max_threads=1).digest()
        os.pwrite(fds[p], v, off)

PIECE = int(sys.argv[2]) << 10 if len(sys.argv) > 2 else 1 << 20
def lane_piece(s, part, fds):
    buf = bytearray(PIECE); mv = memoryview(buf)
    for (p, off, n) in part:
        h = blake3.blake3(max_threads=1); done = 0
        while done < n:
            k = min(PIECE, n - done); v = mv[:k]; recv_into(s, v)
            h.update(v); os.pwrite(fds[p], v, off + done); done += k
        h.digest()

def run(port, lanes, fn, out):
    fds = {}
    for p in files:
        with open(out / p.name, "ab") as f: f.truncate(p.stat().st_size)
        fds[p] = os.open(out / p.name, os.O_WRONLY)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(lanes)]
    r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
    ts = [threading.Thread(target=fn, args=(s, chunks[i::lanes], fds)) for i, s in enumerate(socks)]
    [t.start() for t in ts]; [t.join() for t in ts]
    dt = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_SELF)
    for s in socks: s.close()
    for fd in fds.values(): os.close(fd)
    cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    return total / dt / 1e6, cpu / total * 1e9

if __name__ == "__main__":
    variants = {"whole1": (1, lane_whole), "piece1": (1, lane_piece), "whole2": (2, lane_whole), "piece2": (2, lane_piece)}
    procs = {}
    for lanes in (1, 2):
        a, b = multiprocessing.Pipe(False)
        pr = multiprocessing.Process(target=sender, args=(b, lanes), daemon=True); pr.start(); procs[lanes] = a.recv()
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    res = {k: [] for k in variants}
    for r in range(rounds):
        for name, (lanes, fn) in variants.items():
            with tempfile.TemporaryDirectory() as tmp:
                os.sync()
                res[name].append(run(procs[lanes], lanes, fn, Path(tmp)))
    for name, v in res.items():
        print(f"{name}: MB/s {[round(x[0]) for x in v]} median {statistics.median(x[0] for x in v):.0f}; recv CPU s/GB {statistics.median(x[1] for x in v):.2f}")
