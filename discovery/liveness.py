"""Is a peer still there? Its profile, fetched over its peer port (SWPF) every interval.

mDNS alone learns of a crash only when records expire (minutes). So every
admitted peer is asked for its profile (profile_exchange.py) every PROBE_INTERVAL
on a short connection of its own, answered on the peer's event loop (never its
MLX thread: a long prefill must not make a node look dead). An answer = alive,
and it carries the peer's current profile (discovery.py: Discovery._check).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Callable

from .profile import NodeProfile
from .profile_exchange import MAGIC, answer_profile_request

# Defaults keep the worst case under 3 s: a crash right after a successful
# probe is noticed after FAILURES probes, INTERVAL apart, the last one taking
# at most TIMEOUT: 3 * 0.75 + 0.5 = 2.75 s.
PROBE_INTERVAL = 0.75
# With more peers than PROBES_PER_S * PROBE_INTERVAL (15) the rounds space out so that a node opens at
# most about PROBES_PER_S probe connections a second: every node probing every peer is a cost per node
# that grows with the swarm, and at 32 nodes on 2 cores it took about one of them. A crash is then
# noticed within 3 rounds (31 peers: 1.55 s apart, ~5 s; sooner where a data link to it breaks).
PROBES_PER_S = 20.0
PROBE_TIMEOUT = 0.5
PROBE_FAILURES = 3
# A probe whose connection was taken but whose answer came late (profile_exchange.LateAnswer) found a
# process there, only a slow one: on a machine whose cores are all busy (32 nodes on 2 cores) answers
# come late by the second, and counting them as deaths declared live nodes gone by the thousand, each
# verdict a re-plan that loaded the machine more. A node answering late is gone only after this many
# probes in a row without an answer (~12 s); a dead one (refused) or a lost link (no connection) after
# PROBE_FAILURES as before.
LATE_PROBE_FAILURES = 16


class FailureCounter:
    """Counts consecutive failed probes; `dead` after `limit` in a row, or after `late_limit` in a row
    of which some only came late."""

    def __init__(self, limit: int = PROBE_FAILURES, late_limit: int = LATE_PROBE_FAILURES) -> None:
        self.limit, self.late_limit = limit, max(limit, late_limit)
        self.failures = 0  # probes in a row without an answer
        self.missed = 0  # the last of those in a row that found no process to answer (refused, no connection)

    def record(self, alive: bool, late: bool = False) -> bool:
        """Record a probe result (`late`: failed, though the connection was taken); returns True when the
        peer is now considered dead."""
        if alive:
            self.failures = self.missed = 0
            return False
        self.failures += 1
        self.missed = 0 if late else self.missed + 1
        return self.missed >= self.limit or self.failures >= self.late_limit


def round_interval(interval: float, n_peers: int) -> float:
    """Seconds from one probe round's start to the next's, for `n_peers` peers."""
    return max(interval, n_peers / PROBES_PER_S)


async def serve_liveness_port(
    host: str, port: int, profile: NodeProfile | Callable[[], NodeProfile]
) -> asyncio.Server:
    """A stand-in peer-port listener for standalone use (CLI, tests).

    Accepts connections; answers SWPF profile requests; closes anything else.
    The real node serves its transport on this port instead.
    """

    def current() -> NodeProfile:
        return profile() if callable(profile) else profile

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(reader.readexactly(len(MAGIC)), 2.0)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, OSError):
            first = b""  # a bare liveness probe: connect and close
        if first == MAGIC:
            await answer_profile_request(reader, writer, current())
            return
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    return await asyncio.start_server(handle, host, port, reuse_address=True)
