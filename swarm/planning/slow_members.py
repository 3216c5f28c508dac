"""Members that take no data are left out of the plans, as black holes are, until they read again.

A member may answer every liveness check and announce the plan, and still read nothing of its data
lane, or a trickle: frames to it wait in the kernel's buffers and no token comes back, so every
request through it stops. The liveness check cannot see it, and load deadlines (load_deadlines.py)
clear the record of a stage that announces the plan. So slowness has its own record, here:

- `stalled(node)`: our link to it took no bytes for a few seconds (transport/lane.py). That is
  proof enough: it is left out now.
- `suspect(node)`: a step through it is overdue (entry/swarm_pipeline.py), or a peer says it left it
  out (its profile's `slow` field, read by the coordinator). Hearsay is not proof, or one liar could
  make the swarm drop honest members: the node is probed over the data lane (transport/
  probe_messages.py), and left out only if the probe is not answered within PROBE_TIMEOUT_S plus
  the longest pass its stage may be computing (`busy_for`: a stage reads between passes only, and a
  long prompt's pass on a CPU takes seconds). The probe itself (node/lane_probe.py) gives up sooner
  on a node whose MLX thread, by its own word, computed no long pass meanwhile.

A member left out is probed again every RETRY_S and taken back when it answers (it reads again), or
at once when a peer that listed it lists it no more (it was taken back there: one view again). Each
change is announced in our own profile (`slow`), so the other honest nodes check it too and come to
the same plan. This node never leaves itself out.

Event loop only (planning/coordinator.py owns it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Iterable

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 4.0  # a peer that reads takes well under this for a probe, on a loaded machine too
RETRY_S = 5.0  # a member left out is probed again this often
HEARSAY_GAP_S = 2.0  # on hearsay, a member is not probed again sooner than this
PROFILE_FIELD = "slow"  # the members a node leaves out for slowness, comma-separated, in its profile
MAX_LISTED = 8

ProbeFn = Callable[[str, float], Awaitable[bool]]  # (node, timeout): did it answer in time?


class SlowMembers:
    def __init__(self, own_id: str, probe: ProbeFn, on_change: Callable[[], Awaitable[None]],
                 clock: Callable[[], float] = time.monotonic, busy_for: Callable[[str], float] = lambda _: 0.0):
        """`on_change`: called after a member was left out or taken back (the coordinator replans);
        `busy_for(node)`: the longest pass `node` may be computing now, in seconds."""
        self.own_id, self._probe, self._on_change, self.clock = own_id, probe, on_change, clock
        self.busy_for = busy_for
        self._out: dict[str, float] = {}  # left out, since when
        self._checks: dict[str, asyncio.Task] = {}  # a probe under way (or a member's watch while out)
        self._last_probe: dict[str, float] = {}
        self._hearsay: dict[str, frozenset[str]] = {}  # what each peer's profile said last

    def left_out(self) -> set[str]:
        return set(self._out)

    def checking(self) -> set[str]:
        """Members being probed now because they may be slow (not those left out)."""
        return {node for node in self._checks if node not in self._out}

    def profile_field(self) -> str:
        """What our profile says (PROFILE_FIELD): the first MAX_LISTED we leave out (a profile is small)."""
        return ",".join(sorted(self._out)[:MAX_LISTED])

    # -- what we saw ------------------------------------------------------------------------
    def stalled(self, node: str, why: str) -> None:
        """Our link to `node` took no data: left out now."""
        if node == self.own_id or node in self._out:
            return
        self._leave_out(node, why)

    def suspect(self, nodes: Iterable[str], why: str) -> None:
        """`nodes` may take no data: probe each (at most one probe at a time each), left out if it does not answer."""
        now = self.clock()
        for node in nodes:
            if node == self.own_id or node in self._out or node in self._checks:
                continue
            if now - self._last_probe.get(node, -HEARSAY_GAP_S) < HEARSAY_GAP_S:
                continue
            log.info("probing node %s (%s): it must answer within %.1f s", node, why, self._timeout(node))
            self._start(node, self._check(node, why))

    def heard(self, peer: str, field: str | None, members: set[str]) -> None:
        """`peer`'s profile says it leaves out `field` (PROFILE_FIELD): check those that are members; a
        member we leave out that it no longer lists is probed now (it was taken back there)."""
        said = frozenset(n for n in (field or "").split(",") if n)
        before = self._hearsay.get(peer, frozenset())
        self._hearsay[peer] = said
        if peer in self._out:
            return  # a slow member's word counts for nothing
        self.suspect(sorted((said - before) & members), f"{peer} left it out for taking no data")
        for node in sorted((before - said) & set(self._out)):
            task = self._checks.get(node)
            if task is not None:
                task.cancel()  # its watch: replaced by a probe now
            self._start(node, self._watch(node, first_wait=0.0))

    def forget(self, node: str) -> None:
        """`node` left the swarm: nothing to keep about it."""
        task = self._checks.pop(node, None)
        if task is not None:
            task.cancel()
        self._out.pop(node, None)
        self._hearsay.pop(node, None)
        self._last_probe.pop(node, None)

    async def stop(self) -> None:
        tasks = list(self._checks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- probing ----------------------------------------------------------------------------
    def _start(self, node: str, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._checks[node] = task
        task.add_done_callback(lambda t: self._checks.get(node) is t and self._checks.pop(node))

    async def _answers(self, node: str) -> bool:
        self._last_probe[node] = self.clock()
        try:
            return await self._probe(node, self._timeout(node))
        except Exception as e:  # noqa: BLE001 (whatever went wrong, it did not answer)
            log.debug("probe of %s: %s", node, e)
            return False

    async def _check(self, node: str, why: str) -> None:
        if not await self._answers(node) and node not in self._out:
            self._checks.pop(node, None)
            self._leave_out(node, f"{why}, and it did not answer a probe")

    def _timeout(self, node: str) -> float:
        return PROBE_TIMEOUT_S + self.busy_for(node)

    def _leave_out(self, node: str, why: str) -> None:
        log.warning("node %s takes no data (%s): left out of the plans until it reads again", node, why)
        self._out[node] = self.clock()
        self._start(node, self._watch(node, first_wait=RETRY_S))
        asyncio.ensure_future(self._on_change())

    async def _watch(self, node: str, first_wait: float) -> None:
        """While `node` is out: probe it every RETRY_S; take it back at its first answer."""
        wait = first_wait
        while node in self._out:
            await asyncio.sleep(wait)
            wait = RETRY_S
            if await self._answers(node) and node in self._out:
                del self._out[node]
                log.info("node %s reads again: taken back into the plans", node)
                await self._on_change()
                return

