"""Weights between peers: a holder serves chunks, a fetching node pulls exactly the ones it needs.

On one peer link (event loop; a bulk transfer must not hold up the MLX thread):

    fetcher -> holder   w_manifest                 holder -> fetcher  w_manifest {fingerprint} + manifest JSON
    fetcher -> holder   w_have                     holder -> fetcher  w_have + bitmap of the chunks it holds
    fetcher -> holder   w_get {chunks: [i, ...]}   holder -> fetcher  w_chunk {i} + bytes, one per chunk asked

A fetching node runs LINKS_PER_HOLDER workers per holder, each on a link of its own
and each asking for its next batch (fetch_queue.py) while the current one streams in,
so the holder goes from one batch to the next with no round trip between; every chunk
is hashed as it is written (store.py) and held only if it hashed right, so bytes a
holder altered are never loaded and are asked of another holder. A holder that dies
or stalls mid-batch gives back what it was asked for; one that sends a chunk of the
wrong length is refused that chunk and its link is dropped.

Once the link is up, both ends move the bytes on a thread of their own over the
link's socket (transport/thread_link.py), not on the event loop, whose stream path
copied each chunk four times more (docs/performance.md): the holder sends each chunk with
sendfile (sealed: read and sealed a 1 MiB piece at a time). The fetcher's link thread
receives each chunk a piece at a time (sealed: opens it), and hashes and writes each
piece while it is in the core's cache; two links per holder keep both cores busy.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from ..transport.errors import ConnectionClosed, ProtocolError
from ..transport.frames import Frame
from ..transport.thread_link import ThreadFrameLink, run_on_own_thread
from .fetch_queue import FetchProgress, FetchQueue
from ..models.manifest import Chunk, Manifest, ManifestError
from .store import ChunkRejected, ChunkStore

log = logging.getLogger(__name__)

# The peer link purpose weights travel on (transport/handshake.dial_stream, listener.serve_purpose): behind
# the same hello as the data path, so with a swarm secret only members fetch or serve, sealed.
WEIGHTS_PURPOSE = "weights"
# The largest frame a fetching node takes: a 16 MiB chunk, or the manifest of a model of some 10 TB.
WEIGHTS_MAX_PAYLOAD = 64 << 20

BATCH_BYTES = 64 * 1024 * 1024
# A chunk passes through a buffer of this size (received, opened if sealed, hashed, written): it stays in
# the core's cache (2 MiB of L2 here).
PIECE_BYTES = 1024 * 1024
# Links a fetching node opens to each holder, each with a thread of its own: one link's thread receives,
# hashes and writes in turn, and two keep both of this machine's cores busy (+24% rate on loopback here).
LINKS_PER_HOLDER = 2
MAX_CHUNKS_PER_GET = 256
NEW_HOLDERS_EVERY_S = 1.0
# The longest a holder may go silent mid-batch (fetcher) or a fetcher between requests or while a chunk
# is sent to it (holder, when its listener sets no idle timeout) before the link is dropped.
STALL_AFTER_S = 30.0


class FrameLink(Protocol):
    peer: str

    async def send(self, header: dict, payload: bytes | memoryview = b"") -> None: ...
    async def receive(self) -> Frame: ...
    async def detach(self, timeout: float) -> ThreadFrameLink: ...
    async def close(self) -> None: ...


class FetchStuck(Exception):
    """Chunks are still missing and no holder that can give them is left."""


# -- holder side ----------------------------------------------------------
async def serve_weights(link: FrameLink, store: ChunkStore) -> None:
    """Answer one fetcher's requests until it closes the link (on a thread of the link's own)."""
    bulk = await link.detach(getattr(link, "idle_timeout", None) or STALL_AFTER_S)
    try:
        await run_on_own_thread(bulk, serve_weights_on_thread, bulk, store)
    finally:
        bulk.close()


def serve_weights_on_thread(link: ThreadFrameLink, store: ChunkStore) -> None:
    """The holder's side of one link, blocking: returns when the fetcher closes it."""
    manifest = store.manifest
    files: dict[str, object] = {}
    buffer = bytearray(PIECE_BYTES if link.sealed else 0)  # a sealed link reads a chunk through it, sealing each piece
    try:
        while True:
            try:
                frame = link.receive()
            except ConnectionClosed:
                return
            kind = frame.header["t"]
            if kind == "w_manifest":
                link.send({"t": "w_manifest", "fingerprint": manifest.fingerprint},
                          zlib.compress(manifest.to_json().encode(), 1))
            elif kind == "w_have":
                link.send({"t": "w_have", "n": len(manifest.chunks)}, _bitmap(store.held(), len(manifest.chunks)))
            elif kind == "w_get":
                for index in _chunk_list(frame.header.get("chunks"), len(manifest.chunks)):
                    chunk = manifest.chunks[index]  # only what our manifest names, at its own range
                    if not store.has(chunk):
                        raise ProtocolError(f"asked for chunk {index}, which is not held here")
                    f = files.get(chunk.file) or files.setdefault(chunk.file, open(store.root / chunk.file, "rb"))
                    link.send_file({"t": "w_chunk", "i": index}, f, chunk.offset, chunk.length, buffer)
            else:
                raise ProtocolError(f"unexpected {kind!r} on a weights link")
    finally:
        for f in files.values():
            f.close()


def _chunk_list(value, n: int) -> list[int]:
    if (not isinstance(value, list) or len(value) > MAX_CHUNKS_PER_GET
            or not all(type(i) is int and 0 <= i < n for i in value)):
        raise ProtocolError(f"w_get needs a list of at most {MAX_CHUNKS_PER_GET} chunk indices")
    return value


def _bitmap(held: set[int], n: int) -> bytes:
    bits = bytearray((n + 7) // 8)
    for i in held:
        bits[i >> 3] |= 1 << (i & 7)
    return bytes(bits)


def _unbitmap(data: bytes, n: int) -> set[int]:
    if len(data) != (n + 7) // 8:
        raise ProtocolError(f"w_have bitmap of {len(data)} bytes for {n} chunks")
    return {i for i in range(n) if data[i >> 3] >> (i & 7) & 1}


# -- fetcher side ---------------------------------------------------------
async def fetch_manifest(link: FrameLink, fingerprint: str) -> Manifest:
    """The holder's manifest, if it is the one `fingerprint` names (ManifestError if not)."""
    await link.send({"t": "w_manifest"})
    frame = await link.receive()
    if frame.header["t"] != "w_manifest":
        raise ProtocolError(f"expected w_manifest, got {frame.header['t']!r}")
    try:
        text = zlib.decompressobj().decompress(frame.payload, 256 * 1024 * 1024)
    except zlib.error as e:
        raise ManifestError(f"manifest from {link.peer} does not decompress: {e}") from None
    manifest = Manifest.from_json(text)
    if manifest.fingerprint != fingerprint:
        raise ManifestError(f"{link.peer} sent the manifest of {manifest.fingerprint}, not {fingerprint}")
    return manifest


OpenLink = Callable[[str], Awaitable[FrameLink]]


@dataclass
class FetchReport:
    progress: FetchProgress
    seconds: float
    per_holder: dict[str, int]  # bytes accepted from each holder


class WeightFetch:
    """Fetch `chunks` into `store` from whichever holders `holders()` names, until all are in."""

    def __init__(self, store: ChunkStore, chunks: list[Chunk], open_link: OpenLink,
                 holders: Callable[[], list[str]], *, stuck_after_s: float = 30.0,
                 stall_after_s: float = STALL_AFTER_S,
                 on_progress: Callable[[FetchProgress], None] | None = None) -> None:
        self.store, self.open_link, self.holders = store, open_link, holders
        self.queue = FetchQueue(store.missing(chunks))
        self.stuck_after_s, self.stall_after_s = stuck_after_s, stall_after_s
        self.on_progress = on_progress or (lambda p: None)
        self.per_holder: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self._workers: dict[tuple[str, int], asyncio.Task] = {}

    @property
    def progress(self) -> FetchProgress:
        return self.queue.progress

    async def run(self) -> FetchReport:
        started = time.monotonic()
        stuck_since: float | None = None
        try:
            while not self.queue.done:
                for holder in self.holders():  # new holders, and ones whose link broke but that are still around
                    for lane in range(LINKS_PER_HOLDER):
                        if (holder, lane) not in self._workers or self._workers[holder, lane].done():
                            self._workers[holder, lane] = asyncio.create_task(self._work(holder),
                                                                              name=f"fetch-{holder}-{lane}")
                if self.queue.stuck():
                    stuck_since = stuck_since or time.monotonic()
                    if time.monotonic() - stuck_since > self.stuck_after_s:
                        missing = self.queue.stuck()
                        raise FetchStuck(f"{len(missing)} chunks ({sum(c.length for c in missing) / 1e6:.1f} MB) "
                                         "are held by no reachable peer that serves them correctly")
                else:
                    stuck_since = None
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait(), NEW_HOLDERS_EVERY_S)
                    except asyncio.TimeoutError:
                        pass
            self.store.save_in_background()  # the bytes are verified and written; the disk catches up meanwhile
            return FetchReport(self.progress, time.monotonic() - started, dict(self.per_holder))
        finally:
            for task in self._workers.values():
                task.cancel()
            await asyncio.gather(*self._workers.values(), return_exceptions=True)
            self.store.close_files()  # no link thread writes any more

    async def _work(self, holder: str) -> None:
        link = bulk = None
        outstanding: list[Chunk] = []  # asked of this holder and not arrived: given back if it fails
        try:
            link = await self.open_link(holder)
            bulk = await link.detach(self.stall_after_s)
            frame = await run_on_own_thread(bulk, _ask, bulk, {"t": "w_have"})
            if frame.header["t"] != "w_have":
                raise ProtocolError(f"expected w_have, got {frame.header['t']!r}")
            self.queue.add_holder(holder, _unbitmap(bytes(frame.payload), len(self.store.manifest.chunks)))
            await self._notify()
            while not self.queue.done:
                batch = self._take(holder, outstanding)
                if not batch:  # others hold the rest in flight: wait in case they give some back
                    async with self._changed:
                        await self._changed.wait_for(lambda: self.queue.done or self.queue.has_work_for(holder))
                    continue
                await run_on_own_thread(bulk, self._receive_on_thread, bulk, batch, holder, outstanding,
                                        asyncio.get_running_loop())
                await self._notify()
        except (OSError, ProtocolError, asyncio.TimeoutError) as e:
            log.warning("fetching weights from %s failed: %s; %d chunks go to other holders", holder, e,
                        len(outstanding))
            self.queue.remove_holder(holder)
        finally:
            self.queue.give_back(outstanding, holder)
            if bulk is not None:
                bulk.close()
            if link is not None:
                await link.close()
            await self._notify()

    def _take(self, holder: str, outstanding: list[Chunk]) -> list[Chunk]:
        """On the loop: `holder`'s next batch, counted as outstanding from here on."""
        batch = self.queue.take(holder, BATCH_BYTES)
        outstanding.extend(batch)
        return batch

    async def _take_on_loop(self, holder: str, outstanding: list[Chunk]) -> list[Chunk]:
        return self._take(holder, outstanding)

    def _receive_on_thread(self, link: ThreadFrameLink, batch: list[Chunk], holder: str, outstanding: list[Chunk],
                           loop: asyncio.AbstractEventLoop) -> None:
        """Ask for `batch`, and for the next batch while this one arrives (the holder goes on to it with no
        round trip in between), until the queue has no more for this holder. Each chunk's end is told to
        the loop."""
        piece = bytearray(PIECE_BYTES)
        link.send({"t": "w_get", "chunks": [c.index for c in batch]})
        while batch:
            following = asyncio.run_coroutine_threadsafe(self._take_on_loop(holder, outstanding),
                                                         loop).result(self.stall_after_s)
            if following:
                link.send({"t": "w_get", "chunks": [c.index for c in following]})
            for chunk in batch:
                header, n = link.receive_header()
                if header["t"] != "w_chunk" or header.get("i") != chunk.index:
                    raise ProtocolError(f"expected chunk {chunk.index}, got {header}")
                if n != chunk.length:  # refused before its bytes are read: never asked of this holder again
                    loop.call_soon_threadsafe(self._arrived, chunk, holder, False, outstanding)
                    raise ProtocolError(f"{n} bytes for chunk {chunk.index}, which has {chunk.length}")
                self._land_on_link_thread(link, chunk, piece, holder, outstanding, loop)
            batch = following

    def _land_on_link_thread(self, link: ThreadFrameLink, chunk: Chunk, piece: bytearray, holder: str,
                             outstanding: list[Chunk], loop: asyncio.AbstractEventLoop) -> None:
        """One chunk: received (sealed: opened), hashed and written a piece at a time, all on this thread,
        while each piece is in the core's cache (store.write_as_it_comes); held only if it hashed right
        (and, sealed, its tag checked: a ProtocolError, which drops the link)."""
        try:
            accepted = self.store.write_as_it_comes(chunk, link.receive_payload_in_pieces(piece)) or None
        except ChunkRejected as e:
            log.warning("holder %s served bad bytes: %s; fetching it elsewhere", holder, e)
            accepted = False
        loop.call_soon_threadsafe(self._arrived, chunk, holder, accepted, outstanding)

    def _arrived(self, chunk: Chunk, holder: str, accepted: bool | None, outstanding: list[Chunk]) -> None:
        """On the loop: the bookkeeping of one chunk that came (in order, before its link's thread is done).
        `accepted`: held; False: refused; None: dropped, as another link wrote it (store.write_as_it_comes)."""
        if accepted:
            self.per_holder[holder] = self.per_holder.get(holder, 0) + chunk.length
        self.queue.arrived(chunk, holder, accepted)
        outstanding.remove(chunk)
        self.on_progress(self.progress)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def _ask(link: ThreadFrameLink, header: dict) -> Frame:
    link.send(header)
    return link.receive()
