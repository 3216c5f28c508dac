"""The MLX worker thread: jobs in order on one thread, failures delivered, heap tidied once when idle."""

from __future__ import annotations

import threading
import time

import pytest

from swarm.engine import worker as worker_module
from swarm.engine.worker import MlxWorker

pytestmark = pytest.mark.timeout(30)


async def test_jobs_run_in_order_on_one_thread_and_failures_reach_the_caller() -> None:
    worker = MlxWorker()
    try:
        seen: list[tuple[int, int]] = []
        for i in range(50):
            worker.post(lambda i=i: seen.append((i, threading.get_ident())))
        assert await worker.run(lambda: 7) == 7
        assert [i for i, _ in seen] == list(range(50)) and len({t for _, t in seen}) == 1
        with pytest.raises(ZeroDivisionError):
            await worker.run(lambda: 1 / 0)
        worker.post(lambda: 1 / 0)  # logged; the thread goes on
        assert worker.run_sync(lambda: threading.get_ident()) == seen[0][1] != threading.get_ident()
    finally:
        worker.close()
    assert worker.submit(lambda: 1).cancelled()  # after close nothing runs


async def test_the_heap_is_tidied_once_after_work_not_while_idle(monkeypatch) -> None:
    tidied: list[float] = []
    monkeypatch.setattr(worker_module, "_merge_freed_blocks", lambda: tidied.append(time.monotonic()))
    worker = MlxWorker()
    try:
        time.sleep(0.05)
        assert tidied == []  # no work yet, nothing to tidy
        done = await worker.run(time.monotonic)
        time.sleep(0.05)
        assert len(tidied) == 1 and tidied[0] - done >= worker_module.TIDY_AFTER_S * 0.9
        time.sleep(0.05)
        assert len(tidied) == 1  # idle stays idle
    finally:
        worker.close()


def test_merge_freed_blocks_runs_here() -> None:
    worker_module._merge_freed_blocks()  # glibc: one malloc/free; elsewhere a no-op


async def test_a_recheck_runs_the_after_events_callbacks_by_its_deadline_with_nothing_arriving() -> None:
    worker = MlxWorker()
    try:
        calls: list[float] = []
        deadline: list[float] = []

        def after_events() -> None:
            calls.append(time.monotonic())
            if len(calls) == 1:  # the first round asks to be called again in 20 ms
                deadline.append(time.monotonic() + 0.02)
                worker.mlx_recheck_at(deadline[0])

        await worker.run(worker.after_events, after_events)  # that round of jobs ends with its first call
        time.sleep(0.2)
        assert len(calls) == 2, f"after_events ran {len(calls)} time(s): the recheck did not come"
        assert calls[1] >= deadline[0] - 0.001  # not before it was due
        time.sleep(0.05)
        assert len(calls) == 2  # one recheck, not a loop
    finally:
        worker.close()


def test_close_cancels_the_jobs_not_started_and_closes_the_wake_up_sockets() -> None:
    worker = MlxWorker()
    gate = threading.Event()
    worker.post(gate.wait, 10)  # the thread is busy with this one
    waiting = worker.submit(lambda: 1)  # queued behind it
    threading.Timer(0.2, gate.set).start()
    worker.close()  # the job under way finishes; the queued one never starts
    assert waiting.cancelled(), "a job queued at close was left pending: its waiter would wait for ever"
    assert worker._wake_r.fileno() == -1 and worker._wake_w.fileno() == -1
