"""The entry node's waiting room: one future per request for its next sampled token."""

from __future__ import annotations

import asyncio

from ..inference.pipeline import PipelineBroken


class PendingTokens:
    def __init__(self) -> None:
        self._futures: dict[str, tuple[str, asyncio.Future]] = {}  # rid -> (plan id, future)

    def expect(self, rid: str, plan_id: str) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._futures[rid] = (plan_id, fut)
        return fut

    def resolve(self, header: dict) -> None:
        entry = self._futures.get(header.get("rid"))
        if entry is None or entry[1].done():
            return  # a late answer for a request that already gave up
        plan_id, fut = entry
        if header.get("t") == "tok":
            fut.set_result(int(header["token"]))
        else:
            fut.set_exception(PipelineBroken(f"{header.get('kind')}: {header.get('message')}"))

    async def wait(self, rid: str, fut: asyncio.Future, timeout: float) -> int:
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise PipelineBroken(f"no token within {timeout:.0f}s") from None
        finally:
            if self._futures.get(rid, (None, None))[1] is fut:
                del self._futures[rid]

    def break_all(self, reason: str, keep_plan: str | None = None) -> None:
        """Fail every wait that is not on `keep_plan` (a stage died or the plan changed)."""
        for plan_id, fut in list(self._futures.values()):
            if plan_id != keep_plan and not fut.done():
                fut.set_exception(PipelineBroken(reason))
