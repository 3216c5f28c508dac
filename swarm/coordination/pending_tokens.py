"""The entry node's waiting room: one future per request for its next sampled token.

A future resolves to the whole token message (see messages.token): the token id
and the stages' compute time travel together.
"""

from __future__ import annotations

import asyncio

from ..inference.pipeline import PipelineBroken


class PendingTokens:
    def __init__(self) -> None:
        # rid -> (plan id, position of the awaited token, future)
        self._futures: dict[str, tuple[str, int, asyncio.Future]] = {}

    def expect(self, rid: str, plan_id: str, at: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._futures[rid] = (plan_id, at, fut)
        return fut

    def resolve(self, header: dict) -> None:
        entry = self._futures.get(header.get("rid"))
        if entry is None or entry[2].done():
            return  # a late answer for a request that already gave up
        plan_id, at, fut = entry
        # A late answer from a plan or attempt the request has left behind must not
        # stand in for the current step (it would repeat a token).
        if header.get("plan") != plan_id:
            return
        if header.get("t") == "tok":
            if header.get("at") == at and isinstance(header.get("token"), int):
                fut.set_result(header)
        else:
            fut.set_exception(PipelineBroken(f"{header.get('kind')}: {header.get('message')}"))

    async def wait(self, rid: str, fut: asyncio.Future, timeout: float) -> dict:
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise PipelineBroken(f"no token within {timeout:.0f}s") from None
        finally:
            if self._futures.get(rid, (None, None, None))[2] is fut:
                del self._futures[rid]

    def break_all(self, reason: str, keep_plan: str | None = None) -> None:
        """Fail every wait that is not on `keep_plan` (a stage died or the plan changed)."""
        for plan_id, _, fut in list(self._futures.values()):
            if plan_id != keep_plan and not fut.done():
                fut.set_exception(PipelineBroken(reason))
