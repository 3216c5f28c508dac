"""Serves incoming peer frames: runs forward passes for our stage and routes results.

Frames for our stage are computed one at a time in arrival order (the MLX thread
is single anyway), which also keeps each request's frames in order downstream.
Different requests still overlap across nodes: while we compute one request,
the next stage computes another (pipelining).
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..engine.sampling import SamplingParams
from ..engine.stage import CacheMismatch, Stage
from ..engine.worker import MlxWorker
from ..transport.arrays import encode_array, frame_array
from ..transport.errors import PeerUnreachable, ProtocolError
from ..transport.frames import Frame
from . import messages as msg
from .pending_tokens import PendingTokens
from .router import Router
from .stage_host import StageHost

log = logging.getLogger(__name__)

IDLE_CACHE_S = 600.0  # caches of a request nobody touched this long are freed (its entry died)


class StageService:
    def __init__(self, host: StageHost, router: Router, pending: PendingTokens, worker: MlxWorker):
        self.host, self.router, self.pending, self.worker = host, router, pending, worker
        self._queue: asyncio.Queue[Frame] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        router.local = self.on_message

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name="stage-service")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    async def on_message(self, sender: str, frame: Frame) -> None:
        kind = frame.header.get("t")
        if kind in (msg.FORWARD, msg.RELEASE):
            self._queue.put_nowait(frame)
        elif kind in (msg.TOKEN, msg.ERROR):
            self.pending.resolve(frame.header)
        else:
            log.warning("ignoring a %r frame from %s", kind, sender)

    async def _serve(self) -> None:
        last_gc = asyncio.get_running_loop().time()
        while True:
            frame = await self._queue.get()
            try:
                if frame.header["t"] == msg.RELEASE:
                    await self._release(str(frame.header.get("rid")))
                else:
                    await self._forward(frame)
            except Exception:
                log.exception("failed to serve a %s frame", frame.header.get("t"))
            now = asyncio.get_running_loop().time()
            if now - last_gc > 60 and self.host.stage is not None:
                last_gc = now
                await self.worker.run(self.host.stage.release_idle, IDLE_CACHE_S)

    async def _release(self, rid: str) -> None:
        stage = self.host.stage
        if stage is not None:
            await self.worker.run(stage.release, rid)

    async def _forward(self, frame: Frame) -> None:
        h = frame.header
        rid, entry, plan_id = h.get("rid"), h.get("entry"), h.get("plan")
        if not isinstance(rid, str) or not isinstance(entry, str) or not isinstance(h.get("pos"), int):
            log.warning("dropping a malformed forward frame: %s", {k: h.get(k) for k in ("rid", "entry", "pos")})
            return
        stage, plan, index = self.host.stage, self.host.plan, self.host.stage_index()
        if plan is None or stage is None or plan_id != plan.plan_id or h.get("start") != stage.range.start:
            await self._fail(entry, rid, plan_id, "plan_mismatch",
                             f"node {self.router.node_id} serves plan {self.host.plan_id} "
                             f"layers {stage.range.start if stage else None}, not {plan_id} layer {h.get('start')}")
            return
        sampling = SamplingParams.from_dict(h["sampling"]) if h.get("sampling") else None
        try:
            out, took_s = await self.worker.run(_compute, stage, rid, frame, sampling)
        except (CacheMismatch, ProtocolError) as e:
            await self._fail(entry, rid, plan_id, "cache" if isinstance(e, CacheMismatch) else "protocol", str(e))
            return
        compute_us = _int(h.get("cu")) + round(took_s * 1e6)
        try:
            if stage.range.is_last:
                if sampling is not None:
                    at = h["pos"] + frame.header["shape"][1]
                    await self.router.send(entry, msg.token(rid, plan_id, at, out, compute_us))
                return
            nxt = plan.stages[index + 1]
            dtype, shape, data = out
            header = {**msg.forward(rid, plan_id, h["pos"], nxt.start, entry, h.get("sampling"), compute_us),
                      "dtype": dtype, "shape": shape}
            await self.router.send(nxt.node_id, header, data)
        except PeerUnreachable as e:
            await self._fail(entry, rid, plan_id, "unreachable", str(e))

    async def _fail(self, entry: str, rid: str, plan_id, kind: str, message: str) -> None:
        log.info("request %s: %s (%s)", rid, kind, message)
        try:
            await self.router.send(entry, msg.error(rid, plan_id, kind, message))
        except PeerUnreachable:
            pass  # the entry node is gone too; its clients are gone with it


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _compute(stage: Stage, rid: str, frame: Frame, sampling: SamplingParams | None):
    """On the MLX thread: decode the input, run the shard, encode the output; and how long it took."""
    t0 = time.perf_counter()
    x = frame_array(frame)
    out = stage.forward(rid, x, frame.header["pos"], sampling)
    if isinstance(out, int) or out is None:
        return out, time.perf_counter() - t0
    if stage.range.is_last:
        return None, time.perf_counter() - t0  # a prefill chunk on the last stage: nothing to send on
    return encode_array(out), time.perf_counter() - t0  # the memoryview keeps the array alive until sent
