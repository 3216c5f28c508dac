"""Re-measure this node's speed from its stage's real passes and re-advertise it (present_speed.py).

The stage tells `mlx_pass` of every pass it computes (stage/stage_service.py, MLX thread): a decode
pass of one row is a sample of seconds per layer, its time shared among the stage's layers and, on
the last stage, the head's share (its bytes as so many layers': a decode pass reads every weight
once, so it costs about in proportion to the bytes it reads). The event loop takes the samples every
CHECK_S, applies the rule, and on a change re-publishes the profile's speed and re-plans (the
coordinator re-plans on a peer's change of speed already; our own is no peer event). A change that
would move no layers (`moves_layers`: the plan with it holds as many layers on every node, in another
order at most) is not advertised: every node would re-plan, and replay its requests, for nothing.

A node found slow that is then given no work (the plan moved its layers away) would keep its slow
speed for ever: while idle and slow, it runs its speed probe (engine/speed_probe.py) every
PROBE_EVERY_S, so it comes back when the machine does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Awaitable, Callable

from ..engine.shard import LayerRange
from ..engine.worker import MlxWorker
from ..tasks import cancel_and_wait
from .present_speed import PROBE_ALPHA, STALE_S, PresentSpeed

log = logging.getLogger(__name__)

CHECK_S = 1.0
PROBE_EVERY_S = 2.0  # (more often than present_speed.STALE_S, or its samples would never count)
MAX_KEPT = 4096


class SpeedFollower:
    def __init__(self, present: PresentSpeed, worker: MlxWorker, head_layers: float,
                 publish: Callable[[float], Awaitable[None]],
                 make_probe: Callable[[], Callable[[], float]] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 moves_layers: Callable[[float], bool] | None = None) -> None:
        """`head_layers`: the last stage's head, in layers' worth of bytes; `publish(speed)`: advertise it
        and re-plan; `make_probe()`: a probe (engine/speed_probe.SpeedProbe) whose call gives this
        machine's speed now (both on the MLX thread), for an idle node found slow: kept while it is."""
        self.present, self.worker, self.head_layers = present, worker, head_layers
        self._publish, self._make_probe, self.clock = publish, make_probe, clock
        self._moves_layers = moves_layers  # whether a speed would move layers (else it is not advertised)
        self._probe: Callable[[], float] | None = None
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_KEPT)  # appended on the MLX thread
        self._last_probe = 0.0
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="speed-follower")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def mlx_pass(self, layers: LayerRange, positions: int, rows: int, seconds: float) -> None:
        """A pass of the stage (MLX thread): only decode passes of one row are samples."""
        if positions == 1 and rows == 1:
            share = (layers.end - layers.start) + (self.head_layers if layers.is_last else 0.0)
            self._samples.append((self.clock(), seconds / share))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                await self._check()
            except Exception:
                log.exception("following this node's speed")

    async def _check(self) -> None:
        present = self.present
        while self._samples:
            at, per_layer = self._samples.popleft()
            present.sample(at, per_layer)
        now = self.clock()
        idle = present.last_sample is None or now - present.last_sample > STALE_S
        if not present.slowed():
            self._probe = None  # (its layers' memory back)
        elif idle and self._make_probe is not None and now - self._last_probe >= PROBE_EVERY_S:
            if self._probe is None:
                self._probe = await self.worker.run(self._make_probe)
            measured = await self.worker.run(self._probe)
            self._last_probe = now = self.clock()
            present.sample(now, measured, PROBE_ALPHA)
        before = present.advertised
        speed = present.check(now)
        if speed is not None and self._moves_layers is not None and not self._moves_layers(speed):
            present.advertised = before  # (asked again after another hold, while it stays off)
            log.debug("speed %.3f -> %.3f ms per layer per token would move no layers: not advertised",
                      before * 1e3, speed * 1e3)
            return
        if speed is not None:
            log.info("speed %.3f -> %.3f ms per layer per token (measured %s)", before * 1e3, speed * 1e3,
                     "by the probe, idle" if idle else "on this stage's passes")
            await self._publish(speed)
