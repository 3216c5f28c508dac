"""cancel_and_wait (swarm/tasks.py): a component's stop() ends its background tasks and waits for them."""

from __future__ import annotations

import asyncio

from swarm.tasks import cancel_and_wait


async def test_every_task_is_cancelled_and_has_ended_when_it_returns_and_none_is_skipped():
    cleaned = []

    async def loop(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.01)  # (its own clean-up still runs before the stop returns)
            cleaned.append(name)

    tasks = [asyncio.create_task(loop(n)) for n in ("a", "b")]
    await asyncio.sleep(0)
    await cancel_and_wait(tasks[0], None, tasks[1])
    assert all(t.done() and t.cancelled() for t in tasks)
    assert sorted(cleaned) == ["a", "b"]
    await cancel_and_wait()  # nothing started: nothing to do
