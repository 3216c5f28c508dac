"""A model directory that holds some or all of a manifest's chunks.

A node that fetches weights keeps them in a copy of the model's own layout: the
same files at the same sizes, created sparse, each fetched chunk written at its
own offset as it arrives and held once its hash checked out (only held chunks are
served or loaded; a range is written by one writer at a time, never once held).
mlx loads safetensors lazily, so a shard reads only its own tensors and never
touches the holes. Which chunks are held is
recorded beside the files (`.swarm-held`), so a restart serves and loads what
is on disk and fetches only the rest. The record names only chunks that were
synced to disk before it was written; syncing runs on a thread of its own
(`save_in_background`), so a fetch does not wait for the disk (it loads and
serves from the page cache meanwhile).

A directory the user gave (their own model, the Hugging Face cache) is a store
holding everything, read only.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Iterable

from ..models.manifest import Chunk, Manifest, chunk_hasher

log = logging.getLogger(__name__)

HELD_FILE = ".swarm-held"
# Between saves of the held set while chunks arrive: a crash re-fetches at most what came meanwhile. By time,
# not by count: each save syncs the files, which mid-fetch cost a fifth of the rate here (docs/performance.md).
_SAVE_EVERY_S = 5.0


class ChunkRejected(ValueError):
    """Bytes that do not hash to the manifest's value for their chunk: never held, so never served or loaded."""


class ChunkStore:
    def __init__(self, root: Path, manifest: Manifest, held: set[int], writable: bool) -> None:
        self.root, self.manifest, self.writable = Path(root), manifest, writable
        self._held = held
        self._landing: set[int] = set()  # chunks a link is writing now (write_as_it_comes)
        self._last_save = time.monotonic()
        self._saving = threading.Lock()  # one save at a time (they share the temporary file)
        self._bookkeeping = threading.Lock()  # the held set and the save queue, written from several threads
        self._queued: threading.Thread | None = None  # a background save not started yet: later ones join it
        self._last_saver: threading.Thread | None = None
        # Kept open while chunks arrive: an open/pwrite/close per 16 MiB chunk costs several times the
        # CPU of one descriptor per file, now and then, on ext4.
        self._write_fds: dict[str, int] = {}

    @classmethod
    def complete(cls, model_dir: Path, manifest: Manifest) -> "ChunkStore":
        """The user's own model directory: every chunk held, nothing written."""
        return cls(model_dir, manifest, set(range(len(manifest.chunks))), writable=False)

    @classmethod
    def partial(cls, root: Path, manifest: Manifest) -> "ChunkStore":
        """A fetching node's copy under `root`: files created sparse where missing; held chunks as recorded."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        held: set[int] = set()
        try:
            record = json.loads((root / HELD_FILE).read_text())
            if record.get("fingerprint") == manifest.fingerprint:
                held = {i for i in record.get("chunks", []) if isinstance(i, int) and 0 <= i < len(manifest.chunks)}
        except (OSError, ValueError, AttributeError):
            pass
        for f in manifest.files:
            path = root / f.path
            if not path.exists() or path.stat().st_size != f.size:
                with open(path, "ab") as out:
                    out.truncate(f.size)
        return cls(root, manifest, held, writable=True)

    # -- what is here -----------------------------------------------------
    def has(self, chunk: Chunk) -> bool:
        return chunk.index in self._held

    def held(self) -> set[int]:
        return set(self._held)

    def missing(self, chunks: list[Chunk]) -> list[Chunk]:
        return [c for c in chunks if c.index not in self._held]

    def held_bytes(self) -> int:
        return sum(self.manifest.chunks[i].length for i in self._held)

    # -- reading and writing ----------------------------------------------
    def read(self, chunk: Chunk) -> bytes:
        if chunk.index not in self._held:
            raise KeyError(f"chunk {chunk.index} is not held here")
        with open(self.root / chunk.file, "rb") as f:
            f.seek(chunk.offset)
            return f.read(chunk.length)

    def write(self, chunk: Chunk, data: bytes | memoryview) -> bool:
        """`write_as_it_comes` for bytes at hand."""
        return self.write_as_it_comes(chunk, [memoryview(data)])

    def write_as_it_comes(self, chunk: Chunk, pieces: Iterable[memoryview]) -> bool:
        """Write `pieces`, the chunk's bytes in order, at its place as each arrives, hashing them on the way
        (any thread; each piece must not change before the next is asked for). True once the chunk is
        held: only if they hash to the manifest's value, ChunkRejected if not (its range then holds bytes
        that nothing reads: only held chunks are served or loaded, and its next fetch writes over them).

        False, the pieces read and dropped, for a chunk that is held already or that another link is
        writing now (a holder's second link can still deliver what its first link's failure gave to
        another holder): a range is written by one writer at a time and never once it is held.

        Why a piece at a time: one small enough to stay in the core's cache is received, hashed and
        written while there; a whole 16 MiB chunk read back from memory to hash and again to write cost
        twice the CPU per GB (docs/performance.md)."""
        if not self.writable:
            raise PermissionError(f"{self.root} is a read-only model directory")
        with self._bookkeeping:
            mine = chunk.index not in self._held and chunk.index not in self._landing
            if mine:
                self._landing.add(chunk.index)
        if not mine:
            for _ in pieces:  # the link reads the frame to its end (sealed: to its tag)
                pass
            return False
        try:
            fd, hasher, at = self._write_fd(chunk), chunk_hasher(), chunk.offset
            for piece in pieces:
                hasher.update(piece)
                os.pwrite(fd, piece, at)
                at += len(piece)
            if at - chunk.offset != chunk.length or hasher.hexdigest() != chunk.blake3:
                raise ChunkRejected(f"chunk {chunk.index} ({chunk.tensor or chunk.file}): "
                                    "bytes do not match the manifest")
            self._hold(chunk)
            return True
        finally:
            with self._bookkeeping:
                self._landing.discard(chunk.index)

    def _write_fd(self, chunk: Chunk) -> int:
        with self._bookkeeping:
            fd = self._write_fds.get(chunk.file)
            if fd is None:
                fd = self._write_fds[chunk.file] = os.open(self.root / chunk.file, os.O_WRONLY)
            return fd

    def _hold(self, chunk: Chunk) -> None:
        """`chunk`'s verified bytes are written: held from now on, and recorded with the next save."""
        with self._bookkeeping:
            self._held.add(chunk.index)
            save = time.monotonic() - self._last_save >= _SAVE_EVERY_S
        if save:
            self.save_in_background()

    def close_files(self) -> None:
        """Close the files writes kept open (a later write opens them again)."""
        with self._bookkeeping:
            fds, self._write_fds = list(self._write_fds.values()), {}
        for fd in fds:
            os.close(fd)

    def save_in_background(self) -> None:
        """`save` on a thread of its own: the caller goes on writing. At most one waits behind the one
        running. Not a daemon: a node that exits first waits for it, so its restart finds the record."""
        with self._bookkeeping:
            self._last_save = time.monotonic()
            if self._queued is not None:
                return
            self._queued = self._last_saver = threading.Thread(target=self._save_queued, name="weights-sync")
            self._queued.start()

    def wait_saved(self) -> None:
        """Until the background saves asked for so far are done."""
        if self._last_saver is not None:
            self._last_saver.join()

    def _save_queued(self) -> None:
        with self._saving:
            with self._bookkeeping:
                self._queued = None  # writes from here on need another save
            try:
                self._save_locked()
            except OSError as e:  # the chunks stay held; a restart fetches again what is not on record
                log.warning("could not record the chunks held in %s: %s", self.root, e)

    def save(self) -> None:
        """Record the held chunks (after their bytes are on disk)."""
        with self._saving:
            self._save_locked()

    def _save_locked(self) -> None:
        if not self.writable:
            return
        with self._bookkeeping:
            held = sorted(self._held)  # before the sync: these are on disk once it returns
        self._sync()
        tmp = self.root / f"{HELD_FILE}.tmp"
        tmp.write_text(json.dumps({"fingerprint": self.manifest.fingerprint, "chunks": held}))
        tmp.replace(self.root / HELD_FILE)

    def _sync(self) -> None:
        for f in self.manifest.files:
            fd = os.open(self.root / f.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
