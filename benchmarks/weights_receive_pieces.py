"""Receive, hash and write a model's weights on loopback: whole 16 MiB chunks or a piece at a time, 1 or 2 links.

    python benchmarks/weights_receive_pieces.py [ROUNDS] [PIECE_KIB]

No swarm code: a sender process sendfile()s the default model's safetensors in 16 MiB
chunks over 1 or 2 connections (a thread each); the receiver, per connection on a thread
of its own, either receives a whole chunk, hashes it (BLAKE3) and pwrites it ("whole"), or
does the three for each PIECE_KIB piece (default 1024) while the piece is in the core's
cache ("piece"). Prints MB/s per round and the receiver's CPU seconds per GB. What made
the weights fetch receive in pieces on two links per holder (docs/performance.md, issue 16).
"""

from __future__ import annotations

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

CHUNK = 16 << 20
Chunk = tuple[Path, int, int]  # file, offset, length


def model_chunks() -> list[Chunk]:
    """The default model's safetensors cut in CHUNK-byte pieces, as a manifest cuts them (roughly)."""
    files = sorted(p for p in resolve_model(None).path.iterdir() if p.suffix == ".safetensors")
    return [(p, at, min(CHUNK, p.stat().st_size - at)) for p in files for at in range(0, p.stat().st_size, CHUNK)]


def sender(chunks: list[Chunk], links: int, port_out) -> None:
    """Accept `links` connections at a time and sendfile every `links`-th chunk on each, from a thread each."""
    server = socket.create_server(("127.0.0.1", 0))
    port_out.send(server.getsockname()[1])

    def serve(conn: socket.socket, part: list[Chunk]) -> None:
        with conn:
            fds: dict[Path, int] = {}
            for path, offset, length in part:
                if path not in fds:
                    fds[path] = os.open(path, os.O_RDONLY)
                sent = 0
                while sent < length:
                    sent += os.sendfile(conn.fileno(), fds[path], offset + sent, length - sent)
    while True:
        conns = [server.accept()[0] for _ in range(links)]
        threads = [threading.Thread(target=serve, args=(c, chunks[i::links])) for i, c in enumerate(conns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def receive_exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        got += sock.recv_into(view[got:], 0, socket.MSG_WAITALL)


def receive_whole(sock: socket.socket, part: list[Chunk], fds: dict[Path, int], piece: int) -> None:
    """A whole chunk into one buffer, then hashed, then written."""
    view = memoryview(bytearray(CHUNK))
    for path, offset, length in part:
        receive_exactly(sock, view[:length])
        blake3.blake3(view[:length]).digest()
        os.pwrite(fds[path], view[:length], offset)


def receive_in_pieces(sock: socket.socket, part: list[Chunk], fds: dict[Path, int], piece: int) -> None:
    """Each `piece` bytes received, hashed and written while in the cache."""
    view = memoryview(bytearray(piece))
    for path, offset, length in part:
        hasher, done = blake3.blake3(), 0
        while done < length:
            got = view[:min(piece, length - done)]
            receive_exactly(sock, got)
            hasher.update(got)
            os.pwrite(fds[path], got, offset + done)
            done += len(got)
        hasher.digest()


def run(chunks: list[Chunk], port: int, links: int, receive, piece: int, out: Path) -> tuple[float, float]:
    """MB/s and this process's CPU seconds per GB for one copy of every chunk into fresh sparse files."""
    fds: dict[Path, int] = {}
    for path in {c[0] for c in chunks}:
        with open(out / path.name, "ab") as f:
            f.truncate(path.stat().st_size)
        fds[path] = os.open(out / path.name, os.O_WRONLY)
    total = sum(c[2] for c in chunks)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(links)]
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    threads = [threading.Thread(target=receive, args=(s, chunks[i::links], fds, piece)) for i, s in enumerate(socks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    for s in socks:
        s.close()
    for fd in fds.values():
        os.close(fd)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return total / seconds / 1e6, cpu / total * 1e9


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    piece = (int(sys.argv[2]) if len(sys.argv) > 2 else 1024) << 10
    chunks = model_chunks()
    ports = {}
    for links in (1, 2):
        recv_end, send_end = multiprocessing.Pipe(False)
        multiprocessing.Process(target=sender, args=(chunks, links, send_end), daemon=True).start()
        ports[links] = recv_end.recv()
    ways = {"whole, 1 link": (1, receive_whole), "pieces, 1 link": (1, receive_in_pieces),
            "whole, 2 links": (2, receive_whole), "pieces, 2 links": (2, receive_in_pieces)}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, (links, receive) in ways.items():
            with tempfile.TemporaryDirectory() as tmp:
                os.sync()  # no earlier round's writeback in flight (not timed)
                results[name].append(run(chunks, ports[links], links, receive, piece, Path(tmp)))
    print(f"{sum(c[2] for c in chunks) / 1e6:.0f} MB in {len(chunks)} chunks, pieces of {piece >> 10} KiB\n"
          "| way | MB/s per round | median MB/s | receiver CPU s per GB |\n|---|---|---:|---:|")
    for name, runs in results.items():
        print(f"| {name} | {', '.join(str(round(r[0])) for r in runs)} | {statistics.median(r[0] for r in runs):.0f} "
              f"| {statistics.median(r[1] for r in runs):.2f} |")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
