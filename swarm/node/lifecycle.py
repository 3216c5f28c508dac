"""A node's life on the event loop, from start to stop, driven by signals.

Ctrl-C once: the API takes no new requests (503), the log says how many are finishing,
and the node stops when they have. Ctrl-C again, or SIGTERM: stop now. Ctrl-C while the
node is still starting stops the start. The node itself may start over meanwhile (a new id,
node.run); the gate and these signals are the node's, kept through that. Whatever happens, what was started is stopped
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
    """Run `node` (node.run: it starts over under a new id when its id is another node's) until told
    to stop. Raises what a start raised, DuplicateNodeId, or Interrupted."""
    drain, now, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_interrupt() -> None:  # on the loop
        (now if drain.is_set() else drain).set()

    loop.add_signal_handler(signal.SIGINT, on_interrupt)
    loop.add_signal_handler(signal.SIGTERM, now.set)
    run = asyncio.create_task(node.run(stop), name="node-run")
    try:
        if not await _first(node.serving, run, drain, now) and not run.done():
            stop.set()  # Ctrl-C while starting: node.run stops the start
            await run
            raise Interrupted
        if not run.done():
            await _first(drain, now, run)
        if not run.done() and not now.is_set():
            # The gate is the node's, not one run's: closed, it stays closed through a restart.
            finishing = node.gate.close()
            log.warning("stopping: no new requests; %d %s finishing (Ctrl-C again to stop now)", finishing,
                        "request" if finishing == 1 else "requests")
            idle = asyncio.ensure_future(node.gate.wait_idle())
            await _first(idle, now, run)
            idle.cancel()
        if run.done():
            run.result()  # a restart that failed (a port taken meanwhile, an id from --node-id) raises here
        if node.gate.active:
            log.warning("stopping now: %d %s cut off", node.gate.active,
                        "request" if node.gate.active == 1 else "requests")
        log.info("shutting down")
        stop.set()
        await run
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
        if not run.done():  # (an error above, or this task cancelled): node.run still stops what it started
            stop.set()
            with contextlib.suppress(Exception):  # (what is raised already says what went wrong)
                await asyncio.shield(run)
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
