"""This node's part in sharing weights (event loop): it serves the chunks it holds to any peer
that asks, and before it loads a stage it fetches the chunks that stage needs and it lacks.

Holders are the peers whose profile names the same model fingerprint: the nodes the
user gave the model to, and every node that fetched some of it. What each holds is
asked of it (w_have), so a node that fetched layers 10-20 serves exactly those.

Progress is a FetchStatus the node publishes: in its profile (so every peer's
topology shows it), in /health and /v1/topology, as events, and as a log line every
few seconds. A fetch that cannot finish (no holder, not enough disk) says why and
is tried again when the view changes.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Awaitable, Callable

from ..engine.worker import MlxWorker
from .fetch_queue import FetchProgress
from ..models.manifest import Chunk
from .needs import stage_chunks, stage_tensor_names
from .store import ChunkStore
from .transfer import FetchStuck, FrameLink, OpenLink, WeightFetch, serve_weights

log = logging.getLogger(__name__)

LOG_EVERY_S = 5.0
PUBLISH_EVERY_S = 1.0
DISK_MARGIN_BYTES = 64 * 1024 * 1024


class NotEnoughDisk(Exception):
    pass


@dataclass
class FetchStatus:
    state: str = "idle"  # idle | looking | mismatch | fetching | done | stuck | no_disk
    done_bytes: int = 0  # of this fetch
    total_bytes: int = 0
    received_bytes: int = 0  # everything received from peers since the node started (rejected included)
    needed_bytes: int = 0  # what the current stage needs, all of it (held before or fetched)
    rate_bps: float = 0.0
    rejected: int = 0  # chunks a holder served wrong (refused, fetched again elsewhere)
    error: str = ""

    def to_dict(self) -> dict:
        return {**asdict(self), "rate_bps": round(self.rate_bps)}

    def profile_field(self) -> str:
        """Compact, for the profile (a TXT entry): state/done/total/received/needed/rate."""
        return f"{self.state}/{self.done_bytes}/{self.total_bytes}/{self.received_bytes}/{self.needed_bytes}/" \
               f"{round(self.rate_bps)}/{self.rejected}"


def parse_fetch(field: str | None) -> dict | None:
    """A peer's FetchStatus from its profile (None when it says none, or garbles it)."""
    parts = (field or "").split("/")
    if len(parts) != 7 or not all(p.isdigit() for p in parts[1:]):
        return None
    done, total, received, needed, rate, rejected = map(int, parts[1:])
    return FetchStatus(parts[0][:16], done, total, received, needed, rate, rejected).to_dict()


Publish = Callable[[FetchStatus], Awaitable[None]]


class PeerWeights:
    def __init__(self, worker: MlxWorker, open_link: OpenLink, holders_of: Callable[[str], list[str]],
                 publish: Publish | None = None, store: ChunkStore | None = None,
                 served_us: Callable[[list[str]], None] | None = None) -> None:
        """`holders_of(fingerprint)`: the peers whose profile names that model; `store`: what this node
        holds, None until it knows its model (a fetching node learns it from peers: `hold`);
        `served_us(peers)`: after a fetch, the peers whose chunks passed the checks."""
        self.worker, self.open_link, self.holders_of = worker, open_link, holders_of
        self.publish, self.served_us = publish, served_us
        self.store = store
        self.status = FetchStatus()
        self._received_before = 0
        self._chunks_of: dict[tuple[int, int], list[Chunk]] = {}

    def hold(self, store: ChunkStore) -> None:
        """From now on this node holds (or fetches into) `store`."""
        self.store = store

    def holders(self) -> list[str]:
        """Peers that serve the model this node holds or fetches: they hold some or all of its chunks."""
        return [] if self.store is None else self.holders_of(self.store.manifest.fingerprint)

    # -- holder side --------------------------------------------------------------------------
    async def serve(self, link: FrameLink) -> None:
        """A peer's weights link (the listener hands it over): answer until it closes."""
        if self.store is None:
            await link.close()  # nothing to serve before we know the model
            return
        await serve_weights(link, self.store)

    # -- fetching -------------------------------------------------------------------------------
    async def lacks(self, start: int, end: int) -> bool:
        """Does this node miss chunks that layers [start, end) need?"""
        chunks = await self._stage_chunks(start, end)
        self.status.needed_bytes = sum(c.length for c in chunks)  # shown even when all of it was held
        return bool(self.store.missing(chunks))

    async def ensure_stage(self, start: int, end: int) -> None:
        """Have every chunk layers [start, end) need on disk, fetching what is missing.

        Raises FetchStuck (no holder can give some chunks) or NotEnoughDisk; the caller retries."""
        chunks = await self._stage_chunks(start, end)
        self.status.needed_bytes = sum(c.length for c in chunks)
        await self.fetch(chunks, f"layers [{start}, {end})")

    async def stage_chunks(self, start: int, end: int) -> list[Chunk]:
        """The chunks layers [start, end) need (their stage's tensors and the support files)."""
        return await self._stage_chunks(start, end)

    async def _stage_chunks(self, start: int, end: int) -> list[Chunk]:
        key = (start, end)
        if key not in self._chunks_of:
            names = await self.worker.run(stage_tensor_names, self.store.root, start, end)
            self._chunks_of[key] = stage_chunks(self.store.manifest, names)
        return self._chunks_of[key]

    async def fetch(self, chunks: list[Chunk], what: str) -> None:
        store = self.store
        missing = store.missing(chunks)
        if not missing:
            return
        need = sum(c.length for c in missing)
        free = shutil.disk_usage(store.root).free
        if free < need + DISK_MARGIN_BYTES:
            self.status.state, self.status.error = "no_disk", (
                f"{what} need {need / 1e9:.2f} GB more on {store.root}, {free / 1e9:.2f} GB free")
            await self._publish()
            raise NotEnoughDisk(self.status.error)
        log.info("fetching %s from peers: %d chunks, %.1f MB", what, len(missing), need / 1e6)
        fetch = WeightFetch(store, missing, self.open_link, self.holders, on_progress=self._on_progress)
        self.status = FetchStatus("fetching", 0, need, self.status.received_bytes, self.status.needed_bytes,
                                  rejected=self.status.rejected)
        self._received_before, self._rejected_before = self.status.received_bytes, self.status.rejected
        self._started, self._last_log, self._last_publish = time.monotonic(), 0.0, 0.0
        await self._publish()
        try:
            report = await fetch.run()
        except FetchStuck as e:
            self.status.state, self.status.error = "stuck", str(e)
            await self._publish()
            raise
        self._on_progress(report.progress)
        self.status.state, self.status.error = "done", ""
        if self.served_us is not None:
            self.served_us([holder for holder, n in report.per_holder.items() if n > 0])
        log.info("fetched %s: %.1f MB in %.1f s (%.0f MB/s) from %s", what, report.progress.done_bytes / 1e6,
                 report.seconds, report.progress.done_bytes / 1e6 / max(report.seconds, 1e-9),
                 ", ".join(f"{h} {b / 1e6:.0f} MB" for h, b in sorted(report.per_holder.items())) or "nobody")
        await self._publish()

    def _on_progress(self, progress: FetchProgress) -> None:
        s, now = self.status, time.monotonic()
        s.done_bytes, s.total_bytes = progress.done_bytes, progress.total_bytes
        s.received_bytes = self._received_before + progress.received_bytes
        s.rejected = self._rejected_before + progress.rejected
        s.rate_bps = progress.done_bytes / max(now - self._started, 1e-9)
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.info("fetching weights: %.1f of %.1f MB (%.0f%%), %.1f MB/s", s.done_bytes / 1e6, s.total_bytes / 1e6,
                     100 * s.done_bytes / max(s.total_bytes, 1), s.rate_bps / 1e6)
        if now - self._last_publish >= PUBLISH_EVERY_S:
            self._last_publish = now
            asyncio.get_running_loop().create_task(self._publish())

    async def _publish(self) -> None:
        if self.publish is not None:
            try:
                await self.publish(self.status)
            except Exception:
                log.exception("publishing fetch progress failed")


def fetched_model_dir(root: Path, model_id: str, fingerprint: str) -> Path:
    """Where a node keeps the chunks it fetched of a model (its cache: a restart reads them from disk)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model_id)
    return Path(root) / f"{safe}-{fingerprint}-from-peers"
