"""Receiving a model's bytes into their file: through a buffer and pwrite, or straight into a map of the file.

    python benchmarks/weights_receive_into_file.py [--model DIR] [--rounds 4]

One sender process sends the model's weights file raw (sendfile, loopback); this
process receives it in 16 MiB pieces (the fetch's chunk size) in one of these ways,
alternating round by round, and prints wall time and this thread's CPU seconds per GB
(user / system) for each:

  buffer+pwrite  recv_into one 16 MiB buffer (MSG_WAITALL), pwrite to a sparse file (the fetch today)
  map            recv_into a shared map of the sparse file (the kernel copies into the page cache)
  map+populate   the same, each piece's pages faulted in writable first (MADV_POPULATE_WRITE)
  falloc+map     the file fallocated first, then as map+populate

Each also hashes the piece (blake3) where it landed, so the map variants show the
hash's cost on the page cache too. Experiment only (issue 16): is one copy less worth
the page faults?

Answer (session 24, kernel 6.18, ext4): no. Alone the variants are within the noise
(0.66-1.39 CPU s per GB each, load 3-6). In the fetch itself (the link thread receiving
into a map of the fallocated file, commit 4e3427e/0eec581 on branch issue-16e, since
reverted) the link thread cost 1.0-1.9 CPU s per GB against 0.42 for receive + 0.55 for
the verifier's pwrite on main, and the fetch was no faster (A/B table in the report).
perf: 31% of the fetching process's samples were memset, the kernel zeroing each new
page-cache folio on the receive's first touch (filemap_fault -> page_cache_ra_order ->
ext4_mpage_readpages -> zero_user_segments: a fault must give the page defined bytes),
against 5.7% for the receive's copy itself. pwrite of whole pages skips that zeroing.
"""

from __future__ import annotations

import mmap
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import blake3

sys.path.insert(0, str(Path(__file__).resolve().parent))
import weights_fetch as wf  # noqa: E402

PIECE = 16 << 20
MADV_POPULATE_WRITE = 23  # Linux 5.14+; not in Python 3.11's mmap module


def _sender(path: str, port_out) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port_out.send(srv.getsockname()[1])
    while True:
        conn, _ = srv.accept()
        with conn, open(path, "rb") as f:
            conn.sendfile(f)


def receive(port: int, size: int, out: Path, how: str) -> tuple[float, float, float]:
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    os.ftruncate(fd, size)
    if how == "falloc+map":
        os.posix_fallocate(fd, 0, size)
    r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        if how == "buffer+pwrite":
            buf = bytearray(PIECE)
            for off in range(0, size, PIECE):
                view = memoryview(buf)[:min(PIECE, size - off)]
                got = 0
                while got < len(view):
                    got += s.recv_into(view[got:], 0, socket.MSG_WAITALL)
                blake3.blake3(view).digest()
                os.pwrite(fd, view, off)
        else:
            m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            whole = memoryview(m)
            for off in range(0, size, PIECE):
                n = min(PIECE, size - off)
                if how != "map":
                    start = off & ~(mmap.PAGESIZE - 1)
                    m.madvise(MADV_POPULATE_WRITE, start, off + n - start)
                view = whole[off:off + n]
                got = 0
                while got < n:
                    got += s.recv_into(view[got:], 0, socket.MSG_WAITALL)
                blake3.blake3(view).digest()
                view.release()
            whole.release()
            m.close()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    os.close(fd)
    return wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime


def main() -> None:
    args = wf.parse_args(__doc__.splitlines()[0], rounds=4)
    path = max((p for p in args.model.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    size = path.stat().st_size
    sender, port = wf._start(_sender, str(path))
    hows = ["buffer+pwrite", "map", "map+populate", "falloc+map"]
    got: dict[str, list[tuple[float, float, float]]] = {h: [] for h in hows}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            receive(port, size, Path(tmp) / "warm", "buffer+pwrite")
        for i in range(args.rounds):
            for how in hows if i % 2 == 0 else reversed(hows):
                with tempfile.TemporaryDirectory() as tmp:
                    os.sync()
                    got[how].append(receive(port, size, Path(tmp) / "out", how))
    finally:
        sender.terminate()
    gb = size / 1e9
    print(f"{path.name}: {size / 1e6:.0f} MB, {args.rounds} rounds; load {os.getloadavg()[0]:.1f}")
    print("| receive into | MB/s (median) | user s/GB | system s/GB | total s/GB |\n|---|---:|---:|---:|---:|")
    for how, runs in got.items():
        wall, user, system = (statistics.median(r[k] for r in runs) for k in range(3))
        print(f"| {how} | {size / wall / 1e6:.0f} | {user / gb:.3f} | {system / gb:.3f} | {(user + system) / gb:.3f} |")


if __name__ == "__main__":
    main()
