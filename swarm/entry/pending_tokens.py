"""The entry node's waiting room: one future per request for its next sampled token.

Event loop only. A future resolves to a TokenArrival: the token message (its id and
the stages' compute time travel together) and, when the entry's MLX thread already
started the next step on it (run_ahead.py), when that was.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from ..transport.messages import Error, Token
from .pipeline import PipelineBroken, PrefixMissed


@dataclass(frozen=True)
class TokenArrival:
    token: Token
    next_started: float | None = None  # perf_counter() when the next step left (run_ahead.py)


class PendingTokens:
    def __init__(self) -> None:
        # rid -> {position of an awaited token: ((plan id, attempt), future)}; more than one position
        # when the next step was armed to run ahead (see run_ahead.py), or prompt chunks are out
        self._futures: dict[str, dict[int, tuple[tuple[str, int], asyncio.Future]]] = {}

    def expect(self, rid: str, plan_id: str, at: int, attempt: int = 0) -> asyncio.Future:
        """The future of the token at `at` (the one already expected, if any): a token, or the answer to
        a prompt chunk that ends there (its stages read it)."""
        waits = self._futures.setdefault(rid, {})
        current = waits.get(at)
        if current is not None and current[0] == (plan_id, attempt) and not current[1].cancelled():
            return current[1]
        if current is not None and current[1].done() and not current[1].cancelled():
            current[1].exception()  # (an earlier attempt's, nobody's now: asyncio would log it as lost)
        fut = asyncio.get_running_loop().create_future()
        waits[at] = ((plan_id, attempt), fut)
        return fut

    def resolve(self, message: Token | Error, next_started: float | None = None) -> None:
        waits = self._futures.get(message.rid)
        if not waits:
            return  # a late answer for a request that already gave up
        # A late answer from a plan or attempt the request has left behind must not
        # stand in for the current step (it would repeat a token), nor fail it.
        of = (message.plan_id, message.attempt)
        if isinstance(message, Token):
            expected, fut = waits.get(message.at, (None, None))
            if fut is not None and not fut.done() and of == expected:
                fut.set_result(TokenArrival(message, next_started))
        else:
            broken = PrefixMissed if message.kind == "prompt_cache_miss" else PipelineBroken
            for expected, fut in waits.values():
                if expected == of and not fut.done():
                    fut.set_exception(broken(f"{message.kind}: {message.message}"))

    async def wait(self, rid: str, fut: asyncio.Future, timeout: float, what: str = "token",
                   overdue: tuple[float, Callable[[float], None]] | None = None) -> TokenArrival:
        """The answer `fut` brings; PipelineBroken when none came within `timeout` s. `overdue`: (s, call):
        call(seconds waited) every s while none came (sooner than `timeout`), and wait on: a stage that
        answered a check at the first call may stop reading after it."""
        # One timer per wait, failing the future itself: not wait_for (on Python 3.11 it loses a cancel
        # that lands as the token arrives, and then a request whose client has gone generates on to
        # max_tokens), and not a second timer or wait for `overdue` (a step's host cost, paid per token).
        loop = asyncio.get_running_loop()
        waited = 0.0

        def expired() -> None:
            if not fut.done():
                fut.set_exception(PipelineBroken(f"no {what} within {timeout:.0f}s"))

        def late() -> None:
            nonlocal timer, waited
            if not fut.done():
                waited += overdue[0]
                left = timeout - waited
                timer = loop.call_later(overdue[0], late) if overdue[0] < left else loop.call_later(left, expired)
                overdue[1](waited)

        if overdue is not None and overdue[0] < timeout:
            timer = loop.call_later(overdue[0], late)
        else:
            timer = loop.call_later(timeout, expired)
        try:
            return await fut
        finally:
            timer.cancel()
            waits = self._futures.get(rid, {})
            for at, (_, f) in list(waits.items()):
                if f is fut:
                    del waits[at]
            if not waits:
                self._futures.pop(rid, None)

    def forget(self, rid: str) -> None:
        """The request is over: drop what it still expected (a step armed ahead)."""
        for _, fut in self._futures.pop(rid, {}).values():
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # seen: asyncio would log a broken wait nobody got to as an error

    def break_all(self, reason: str, keep_plans: frozenset[str] = frozenset()) -> None:
        """Fail every wait that is not on one of `keep_plans` (a stage died or the plan changed)."""
        for waits in list(self._futures.values()):
            for (plan_id, _), fut in waits.values():
                if plan_id not in keep_plans and not fut.done():
                    fut.set_exception(PipelineBroken(reason))
