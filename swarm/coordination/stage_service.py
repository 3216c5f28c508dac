"""Serves frames for our stage: runs their forward passes and sends the results on.

All of it runs on the MLX thread: frames from peers arrive there on the data
lane (transport/lane.py), are computed, and leave on the lane, without waking
the event loop (on an idle CPU every wake-up costs more than the socket). Only
what the entry node's clients wait for (tokens, errors) goes over to the event
loop. Frames that reach us on the event loop (our own entry's steps for stage 0,
or a peer writing on a connection of ours) are posted to the MLX thread.

Frames for our stage are computed in arrival order, which also keeps each
request's frames in order downstream. Different requests still overlap across
nodes: while we compute one request, the next stage computes another.

With max_batch > 1 (opt-in, `--batch-decode`), decode steps of different
requests that queued up while we computed run as one pass: the weights are read
once for all of them, which is what bounds decode speed. Batched rows may differ
from a lone request's in the last bits, so greedy output can then differ from a
single machine's; the default (1) keeps it identical.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from ..engine.sampling import SamplingParams
from ..engine.shard_runner import CacheMismatch, ShardRunner
from ..engine.worker import MlxWorker
from ..hop_trace import STEP_END, STEP_START, mark
from ..transport.arrays import encode_array, frame_array
from ..transport.errors import PeerUnreachable, ProtocolError
from ..transport.frames import Frame
from ..transport.lane import DataLane
from . import messages as msg
from .pending_tokens import PendingTokens
from .router import Router
from .run_ahead import RunAhead
from .stage_host import StageHost

log = logging.getLogger(__name__)

IDLE_CACHE_S = 600.0  # caches of a request nobody touched this long are freed (its entry died)
GC_EVERY_S = 60.0


class StageService:
    def __init__(self, host: StageHost, router: Router, pending: PendingTokens, worker: MlxWorker,
                 lane: DataLane, run_ahead: RunAhead, max_batch: int = 1):
        self.host, self.pending, self.worker, self.lane = host, pending, worker, lane
        self.run_ahead = run_ahead
        self.max_batch = max_batch
        self.batched_passes = 0  # passes that ran more than one request's decode step
        self.batched_rows = 0
        self._frames: deque[Frame] = deque()  # for our stage, in arrival order; MLX thread only
        self._main_loop: asyncio.AbstractEventLoop | None = None
        self._last_gc = time.monotonic()
        router.local = self.on_message
        worker.after_events(self._serve)

    @property
    def node_id(self) -> str:
        return self.lane.node_id

    def start(self) -> None:
        self._main_loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        await self.worker.run(self.lane.close)

    # -- on the event loop ------------------------------------------------
    async def on_message(self, sender: str, frame: Frame) -> None:
        kind = frame.header.get("t")
        if kind in (msg.FORWARD, msg.RELEASE):
            self.worker.post(self._frames.append, frame)
        elif kind in (msg.TOKEN, msg.ERROR):
            self.pending.resolve(frame.header)
        else:
            log.warning("ignoring a %r frame from %s", kind, sender)

    def drop_peer(self, node_id: str) -> None:
        """A peer left: close our lane connection to it (from any thread)."""
        self.worker.post(self.lane.drop, node_id)

    # -- on the MLX thread ------------------------------------------------
    def on_lane_frame(self, sender: str, frame: Frame) -> None:
        kind = frame.header.get("t")
        if kind in (msg.FORWARD, msg.RELEASE):
            mark("received", frame.header)
            self._frames.append(frame)
        elif kind in (msg.TOKEN, msg.ERROR):
            self._to_entry(frame.header)
        else:
            log.warning("ignoring a %r frame from %s", kind, sender)

    def _to_entry(self, header: dict) -> None:
        """A token or error for a request this node is the entry of: its client waits on the loop.

        A token whose next step was armed starts that step right here (run_ahead.py)."""
        if header.get("t") == msg.TOKEN:
            mark(STEP_END, header)
        step = self.run_ahead.next_step(header) if header.get("t") == msg.TOKEN else None
        if step is not None:
            mark(STEP_START, step.header)
            self._frames.append(step)
            header = {**header, RunAhead.NEXT_STARTED: self.run_ahead.started_at(header["rid"])}
        if self._main_loop is not None:
            self._main_loop.call_soon_threadsafe(self.pending.resolve, header)

    def _serve(self) -> None:
        """Compute every frame queued for our stage (called after each round of socket events)."""
        while self._frames:
            frame = self._frames.popleft()
            mark("dequeued", frame.header)
            try:
                if frame.header["t"] == msg.RELEASE:
                    if self.host.stage is not None:
                        self.host.stage.release(str(frame.header.get("rid")))
                else:
                    self._forward(self._with_queued_decode_steps(frame))
            except Exception:
                log.exception("failed to serve a %s frame", frame.header.get("t"))
        now = time.monotonic()
        if now - self._last_gc > GC_EVERY_S and self.host.stage is not None:
            self._last_gc = now
            self.host.stage.release_idle(IDLE_CACHE_S)

    def _with_queued_decode_steps(self, frame: Frame) -> list[Frame]:
        """`frame`, plus the decode steps queued right behind it, up to max_batch.

        Only consecutive frames from the head of the queue: nothing overtakes a frame
        it was queued behind, so each request's frames keep their order.
        """
        frames = [frame]
        if self.max_batch < 2 or not _is_decode_step(frame):
            return frames
        queued = self._frames
        rids, like = {frame.header.get("rid")}, (frame.header.get("dtype"), frame.header.get("shape"))
        while (len(frames) < self.max_batch and queued and _is_decode_step(queued[0])
               and (queued[0].header.get("dtype"), queued[0].header.get("shape")) == like
               and queued[0].header.get("rid") not in rids):
            nxt = queued.popleft()
            rids.add(nxt.header.get("rid"))
            frames.append(nxt)
        return frames

    def _forward(self, frames: list[Frame]) -> None:
        stage, plan, index = self.host.stage, self.host.plan, self.host.stage_index()
        accepted = [(f, s) for f in frames if (s := self._accept(f, stage, plan)) is not False]
        if not accepted:
            return
        if len(accepted) == 1 or not stage.shard.can_batch:  # (a block decode_batch cannot unroll)
            for frame, sampling in accepted:
                out, took_s = _compute(stage, frame, sampling)
                self._deliver(frame, sampling, out, took_s, stage, plan, index)
            return
        outs = _compute_batch(stage, accepted)
        self.batched_passes += 1
        self.batched_rows += len(accepted)
        for (frame, sampling), (out, took_s) in zip(accepted, outs):
            self._deliver(frame, sampling, out, took_s, stage, plan, index)

    def _accept(self, frame: Frame, stage: ShardRunner | None, plan) -> SamplingParams | None | bool:
        """The frame's sampling params if we can serve it; False (answered or dropped) if not."""
        h = frame.header
        rid, entry, plan_id = h.get("rid"), h.get("entry"), h.get("plan")
        if not isinstance(rid, str) or not isinstance(entry, str) or not isinstance(h.get("pos"), int):
            log.warning("dropping a malformed forward frame: %s", {k: h.get(k) for k in ("rid", "entry", "pos")})
            return False
        if plan is None or stage is None or plan_id != plan.plan_id or h.get("start") != stage.range.start:
            self._fail(entry, rid, plan_id, "plan_mismatch",
                       f"node {self.node_id} serves plan {self.host.plan_id} "
                       f"layers {stage.range.start if stage else None}, not {plan_id} layer {h.get('start')}")
            return False
        try:
            return SamplingParams.from_dict(h["sampling"]) if h.get("sampling") else None
        except (KeyError, TypeError, ValueError) as e:
            self._fail(entry, rid, plan_id, "protocol", f"bad sampling parameters: {e}")
            return False

    def _deliver(self, frame: Frame, sampling: SamplingParams | None, out, took_s: float,
                 stage: ShardRunner, plan, index: int) -> None:
        h = frame.header
        rid, entry, plan_id = h["rid"], h["entry"], h.get("plan")
        if isinstance(out, (CacheMismatch, ProtocolError)):
            self._fail(entry, rid, plan_id, "cache" if isinstance(out, CacheMismatch) else "protocol", str(out))
            return
        compute_us = _int(h.get("cu")) + round(took_s * 1e6)
        try:
            if stage.range.is_last:
                if sampling is not None:
                    at = h["pos"] + frame.header["shape"][1]
                    mark("send", h)
                    self._send(entry, msg.token(rid, plan_id, at, out, compute_us))
                    mark("sent", h)
                return
            nxt = plan.stages[index + 1]
            dtype, shape, data = out
            header = {**msg.forward(rid, plan_id, h["pos"], nxt.start, entry, h.get("sampling"), compute_us),
                      "dtype": dtype, "shape": shape}
            mark("send", h)
            self._send(nxt.node_id, header, data)
            mark("sent", h)
        except PeerUnreachable as e:
            self._fail(entry, rid, plan_id, "unreachable", str(e))

    def _send(self, node_id: str, header: dict, payload: bytes | memoryview = b"") -> None:
        if node_id == self.node_id:  # a token or error for our own request (we are entry and last stage)
            self._to_entry(header)
        else:
            self.lane.send(node_id, header, payload)

    def _fail(self, entry: str, rid: str, plan_id, kind: str, message: str) -> None:
        log.info("request %s: %s (%s)", rid, kind, message)
        try:
            self._send(entry, msg.error(rid, plan_id, kind, message))
        except PeerUnreachable:
            pass  # the entry node is gone too; its clients are gone with it


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _is_decode_step(frame: Frame) -> bool:
    h = frame.header
    shape = h.get("shape")
    return (h.get("t") == msg.FORWARD and isinstance(h.get("pos"), int) and h["pos"] > 0
            and isinstance(shape, list) and len(shape) >= 2 and shape[0] == 1 and shape[1] == 1)


def _result(stage: ShardRunner, out):
    """What to deliver for a forward result: a token, None, or the encoded activations."""
    if isinstance(out, (int, Exception)) or out is None:
        return out
    if stage.range.is_last:
        return None  # a prefill chunk on the last stage: nothing to send on
    return encode_array(out)  # the memoryview keeps the array alive until sent


def _compute(stage: ShardRunner, frame: Frame, sampling: SamplingParams | None):
    """On the MLX thread: decode the input, run the shard, encode the output; and how long it took.

    A request's own failure (lost cache, bad array) is returned, not raised."""
    mark("compute_start", frame.header)
    t0 = time.perf_counter()
    try:
        out = stage.forward(frame.header["rid"], frame_array(frame), frame.header["pos"], sampling)
    except (CacheMismatch, ProtocolError) as e:
        out = e
    result = _result(stage, out), time.perf_counter() - t0
    mark("compute_end", frame.header)
    return result


def _compute_batch(stage: ShardRunner, accepted: list[tuple[Frame, SamplingParams | None]]):
    """_compute for several decode steps in one pass; each row is charged the whole pass."""
    t0 = time.perf_counter()
    items, results = [], {}
    for i, (frame, sampling) in enumerate(accepted):
        try:
            items.append((i, (frame.header["rid"], frame_array(frame), frame.header["pos"], sampling)))
        except ProtocolError as e:
            results[i] = e
    outs = stage.decode_batch([item for _, item in items]) if items else []
    for (i, _), out in zip(items, outs):
        results[i] = out
    took = time.perf_counter() - t0
    return [(_result(stage, results[i]), took) for i in range(len(accepted))]
