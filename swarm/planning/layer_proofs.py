"""Which peers proved that they hold the layers they claim: only those are planned (event loop).

A record that claims the model, much memory and a fast speed costs nothing to publish, and an
endpoint that answers profile probes costs little more: a plan built from such claims stalls on
stages that never load. So a peer enters the plans only once it answered a challenge over the
layers its profile says it holds (weights/layer_proof.py), per instance: a restarted node proves
again. A proof stays good for PROVEN_FOR_S and is renewed before it ends; a new claim (the node
fetched other layers) is challenged at once while the proof before keeps the node planned, so a
node whose layers move does not leave and re-enter the plans.

Bounded work whatever the number of claimants: challenges start at most RATE_PER_S a second
(MAX_IN_FLIGHT at once), a candidate that failed waits FIRST_BACKOFF_S, doubling up to
MAX_BACKOFF_S, and the order is renewals first, then candidates by fewest failures, newest first
(a node that just joined is not queued behind a flood of records that keep failing), and those seen
together in a random order (a record cannot buy an earlier challenge with the node id it picks).
Peers whose weight chunks passed this node's checks go before the others with as few failures
(`prefer`): a node that fetched its layers meets the swarm and any flood of records at once, and
its peers, which plan it as soon as it proves itself to them, leave it out if it takes the flood's
time to plan them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

PROVEN_FOR_S = 600.0
RENEW_AFTER_S = 300.0
FIRST_BACKOFF_S = 5.0
MAX_BACKOFF_S = 300.0
RATE_PER_S = 8.0
MAX_IN_FLIGHT = 4
FORGET_AFTER_S = 900.0  # a candidate not seen in the view this long is forgotten
MAX_RECORDS = 4096


@dataclass(frozen=True)
class Claim:
    node_id: str
    instance: str
    holds: tuple[int, int]


@dataclass
class _Record:
    claim: Claim  # the newest claim seen
    first_seen: float
    last_seen: float
    proven_until: float = 0.0  # of the last claim that proved (may be an older claim of this instance)
    proven_claim: Claim | None = None
    failures: int = 0
    next_try: float = 0.0
    in_flight: bool = False
    draw: float = field(default_factory=random.random)  # its place among records seen at once


# (claim) -> None when proved; raises when not (any exception: a failed proof)
Challenge = Callable[[Claim], Awaitable[None]]


class LayerProofs:
    def __init__(self, challenge: Challenge, on_change: Callable[[], Awaitable[None]], *,
                 clock: Callable[[], float] = time.monotonic, rate_per_s: float = RATE_PER_S,
                 max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.challenge, self.on_change, self.clock = challenge, on_change, clock
        self.rate_per_s, self.max_in_flight = rate_per_s, max_in_flight
        self._records: dict[tuple[str, str], _Record] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._in_flight: set[asyncio.Task] = set()
        self._preferred: set[str] = set()
        self.started = self.passed = self.failed = 0

    # -- what planning asks ------------------------------------------------------------------------
    def proven(self, node_id: str, instance: str) -> bool:
        record = self._records.get((node_id, instance))
        return record is not None and record.proven_until > self.clock()

    def refuted(self, node_id: str, instance: str) -> bool:
        """Its last challenge failed (and no proof of it holds now)."""
        record = self._records.get((node_id, instance))
        return record is not None and record.failures > 0 and record.proven_until <= self.clock()

    def consider(self, claims: list[Claim]) -> None:
        """The candidates in the view now, with what they claim: challenge whoever needs it, in time."""
        now, due = self.clock(), False
        for claim in claims:
            key = (claim.node_id, claim.instance)
            record = self._records.get(key)
            if record is None:
                if len(self._records) >= MAX_RECORDS:
                    self._forget(now)
                    if len(self._records) >= MAX_RECORDS:
                        continue  # a flood of instances: they wait until older records are forgotten
                record = self._records[key] = _Record(claim, now, now)
                due = True
            elif record.claim != claim:
                record.claim, record.failures, record.next_try = claim, 0, 0.0  # a new claim: ask now
                due = True
            record.last_seen = now
        if due:
            self._wake.set()

    def prefer(self, node_ids: list[str]) -> None:
        """These peers served us weight chunks that passed our checks: ask them before unknown claims."""
        if not set(node_ids) <= self._preferred:
            self._preferred.update(node_ids)
            self._wake.set()

    def status(self) -> dict:
        now = self.clock()
        return {"proven": sum(r.proven_until > now for r in self._records.values()),
                "unproven": sum(r.proven_until <= now for r in self._records.values()),
                "challenges": self.started, "passed": self.passed, "failed": self.failed}

    # -- running -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="layer-proofs")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._in_flight) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _needs_asking(self, record: _Record, now: float) -> bool:
        if record.in_flight or record.next_try > now:
            return False
        proven_now = record.proven_until > now and record.proven_claim == record.claim
        return not proven_now or record.proven_until - now < PROVEN_FOR_S - RENEW_AFTER_S

    def _next(self, now: float) -> _Record | None:
        due = [r for r in self._records.values() if self._needs_asking(r, now) and now - r.last_seen < FORGET_AFTER_S]
        if not due:
            return None
        # Renewals of nodes planned now first, then the fewest failures, peers that served us checked
        # weights, the newest first.
        return min(due, key=lambda r: (r.proven_until <= now, r.failures, r.claim.node_id not in self._preferred,
                                       -r.first_seen, r.draw))

    def _next_wake(self, now: float) -> float | None:
        times = []
        for r in self._records.values():
            if r.in_flight or now - r.last_seen >= FORGET_AFTER_S:
                continue
            if r.proven_until > now and r.proven_claim == r.claim:
                times.append(max(r.next_try, r.proven_until - (PROVEN_FOR_S - RENEW_AFTER_S)))
            else:
                times.append(r.next_try)
        return min(times) if times else None

    async def _run(self) -> None:
        last_start = float("-inf")
        while True:
            now = self.clock()
            record = self._next(now) if len(self._in_flight) < self.max_in_flight else None
            gap = 1.0 / self.rate_per_s - (now - last_start)
            if record is not None and gap <= 0:
                last_start = now
                record.in_flight = True
                self.started += 1
                task = asyncio.create_task(self._ask(record, record.claim), name="layer-proof")
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
                continue
            if record is not None:
                wait = gap
            else:
                wake = self._next_wake(now)
                wait = None if wake is None else max(0.0, wake - now)
                if len(self._in_flight) >= self.max_in_flight:
                    wait = None  # a finishing challenge wakes us
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), None if wait is None else max(wait, 0.01))

    async def _ask(self, record: _Record, claim: Claim) -> None:
        was = self.proven(claim.node_id, claim.instance)
        try:
            await self.challenge(claim)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.failed += 1
            record.failures += 1
            now = self.clock()
            record.next_try = now + min(FIRST_BACKOFF_S * 2 ** (record.failures - 1), MAX_BACKOFF_S)
            if record.proven_claim == claim:  # this very claim no longer proves: out now
                record.proven_until = 0.0
            if record.failures == 1 or was:
                log.info("node %s did not prove it holds layers [%d, %d): %s; asked again in %.0f s",
                         claim.node_id, *claim.holds, str(e)[:200] or type(e).__name__, record.next_try - now)
        else:
            self.passed += 1
            record.failures, record.next_try = 0, 0.0
            record.proven_claim, record.proven_until = claim, self.clock() + PROVEN_FOR_S
            if not was:
                log.info("node %s proved it holds layers [%d, %d)", claim.node_id, *claim.holds)
        finally:
            record.in_flight = False
            # Out of the in-flight set before the wake: a done callback runs only after the loop looked.
            self._in_flight.discard(asyncio.current_task())
            self._wake.set()
        if self.proven(claim.node_id, claim.instance) != was:
            await self.on_change()

    def _forget(self, now: float) -> None:
        for key, r in list(self._records.items()):
            if now - r.last_seen >= FORGET_AFTER_S and not r.in_flight:
                del self._records[key]
