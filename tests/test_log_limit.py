"""What a stranger can make a node log is bounded: once per key, or once per interval with a count."""

from __future__ import annotations

import asyncio
import errno
import logging

from swarm.transport.log_limit import LogLimiter, limit_loop_exceptions


def test_once_per_key_then_debug(caplog):
    caplog.set_level(logging.DEBUG)
    limiter = LogLimiter(logging.getLogger("t"))
    for _ in range(100):
        limiter.once(("10.0.0.9", "auth"), "refused %s", "x")
    limiter.once(("10.0.0.8", "auth"), "refused %s", "y")
    levels = [r.levelno for r in caplog.records]
    assert levels.count(logging.WARNING) == 2 and levels.count(logging.DEBUG) == 99


def test_every_interval_counts_what_it_held_back(caplog, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("swarm.transport.log_limit.time.monotonic", lambda: now[0])
    limiter = LogLimiter(logging.getLogger("t"))
    for _ in range(500):
        limiter.every("flood", 60, "closing %s", "x")
        now[0] += 0.1  # 50 s of it
    now[0] += 11
    limiter.every("flood", 60, "closing %s", "x")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["closing x", "closing x (499 more like it in the last 60 s not logged)"]


async def test_asyncio_accept_errors_are_logged_at_a_bounded_rate(caplog):
    loop = asyncio.get_running_loop()
    before = loop.get_exception_handler()
    limit_loop_exceptions(loop, seconds=60)
    try:
        for _ in range(1000):  # what asyncio's accept loop reports when descriptors run out
            loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                         "exception": OSError(errno.EMFILE, "Too many open files"),
                                         "socket": None})
        lines = [r for r in caplog.records if r.name == "asyncio"]
        assert len(lines) == 1 and "out of system resource" in lines[0].getMessage()
    finally:
        loop.set_exception_handler(before)
