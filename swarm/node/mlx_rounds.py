"""Is a peer's MLX thread at long rounds of work? Asked of a peer that does not answer a probe.

A stage reads its data lane between rounds of work only (engine/worker.py), so a probe of a
peer allows for the longest pass it may be computing (planning/slow_members.py): seconds on a
CPU. The peer's event loop can tell whether its MLX thread has been at such rounds: this node's
"round" purpose answers its longest round in the last seconds, the one under way included. A
peer whose thread turned its rounds over quickly all along and still did not read our probe takes
no data; one at long rounds gets the whole allowance (node/lane_probe.py). The answer is the peer's word: it can only buy it
what it had without asking, or leave itself out sooner. Over proved links (handshake.dial_stream),
sealed in a closed swarm, like the profile's.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from ..engine.worker import MlxWorker
from ..transport.stream_link import StreamFrameLink

ROUND_PURPOSE = "round"
ROUND_MAX_PAYLOAD = 64  # the answer is one header, no payload


def serve_round(worker: MlxWorker):
    """The listener's handler for "round" links: our MLX thread's longest recent round of work, in seconds."""
    async def handler(link: StreamFrameLink) -> None:
        await link.send({"t": "round", "s": round(worker.longest_round(), 3)}, b"")
    return handler


async def ask_round(open_link: Callable[[], Awaitable[StreamFrameLink]], timeout: float) -> float | None:
    """Seconds of the peer's MLX thread's longest recent round; None: no (well-formed) answer in time."""
    try:
        async with asyncio.timeout(timeout):
            link = await open_link()
            try:
                frame = await link.receive()
            finally:
                await link.close()
    except Exception:  # noqa: BLE001 (refused, closed, garbled or late: no answer)
        return None
    seconds = frame.header.get("s") if frame.header.get("t") == "round" else None
    return float(seconds) if isinstance(seconds, (int, float)) and 0 <= seconds < 1e9 else None
