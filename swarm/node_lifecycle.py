"""A node's life on the event loop, from start to stop, driven by signals.

Ctrl-C once: the API takes no new requests (503), the log says how many are finishing,
and the node stops when they have. Ctrl-C again, or SIGTERM: stop now. Ctrl-C while the
node is still starting stops the start. Whatever happens, what was started is stopped
and the MLX thread is closed, so the process never aborts on its way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """Stopped before the node had started."""


async def serve(node) -> None:
    """Start `node`, run it until told to stop, stop it. Raises what the start raised, or Interrupted."""
    drain, now = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_interrupt() -> None:  # on the loop
        (now if drain.is_set() else drain).set()

    loop.add_signal_handler(signal.SIGINT, on_interrupt)
    loop.add_signal_handler(signal.SIGTERM, now.set)
    try:
        start = asyncio.create_task(node.start(), name="node-start")
        if not await _first(start, drain, now):
            start.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await start
            raise Interrupted
        start.result()  # a start that failed raises here (e.g. PortError)
        await _first(drain, now)
        if not now.is_set():
            finishing = node.gate.close()
            log.warning("stopping: no new requests; %d %s finishing (Ctrl-C again to stop now)", finishing,
                        "request" if finishing == 1 else "requests")
            idle = asyncio.ensure_future(node.gate.wait_idle())
            await _first(idle, now)
            idle.cancel()
        if node.gate.active:
            log.warning("stopping now: %d %s cut off", node.gate.active,
                        "request" if node.gate.active == 1 else "requests")
        log.info("shutting down")
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
        await node.stop()
    log.info("stopped")


async def _first(*waits) -> bool:
    """Wait for the first of tasks / events; True if it was the first one given."""
    tasks = [w if isinstance(w, asyncio.Future) else asyncio.ensure_future(w.wait()) for w in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w, t in zip(waits, tasks):
            if t is not w:  # our own waits on events; a task given stays the caller's
                t.cancel()
    return tasks[0] in done
