"""The end of a component's background tasks, as its `stop()` waits for it.

A component that runs a loop of its own starts it with `asyncio.create_task` and, when stopped, cancels
it and waits for it to end: its cancellation is its own, not the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(*tasks: asyncio.Task | None) -> None:
    """Cancel every task given (None: never started) and wait until each has ended."""
    started = [task for task in tasks if task is not None]
    for task in started:
        task.cancel()
    for task in started:
        with contextlib.suppress(asyncio.CancelledError):
            await task
