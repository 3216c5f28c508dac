"""What a decode step costs beyond computing: the pipeline's own overhead per hop.

Every stage adds the time its forward pass took (decode the frame, run the layers,
encode the output) to the frame's "cu" field, in microseconds; the last stage
returns the sum with the token. The entry node times the whole step, so

    overhead = step wall time - sum of stage compute

is everything the swarm adds on top of the layers themselves: serialization,
TCP and whatever thread hand-offs remain. Divided by the hops a token makes (one per
network message), it is the per-hop overhead, measured per step, without the
noise of comparing two separate runs.
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW = 256  # decode steps kept


class HopTiming:
    def __init__(self) -> None:
        self._steps: deque[tuple[float, float, int]] = deque(maxlen=WINDOW)  # (wall s, compute s, hops)

    def record(self, wall_s: float, compute_us: int, hops: int) -> None:
        self._steps.append((wall_s, compute_us / 1e6, hops))

    def to_dict(self) -> dict:
        """Medians over the recent decode steps this node was the entry of (ms)."""
        steps = list(self._steps)
        if not steps:
            return {"decode_steps": 0}
        per_hop = [max(w - c, 0.0) / h for w, c, h in steps if h > 0]
        return {
            "decode_steps": len(steps),
            "step_ms": round(statistics.median(w for w, _, _ in steps) * 1e3, 3),
            "compute_ms": round(statistics.median(c for _, c, _ in steps) * 1e3, 3),
            "overhead_ms": round(statistics.median(max(w - c, 0.0) for w, c, _ in steps) * 1e3, 3),
            "hops": steps[-1][2],
            "overhead_per_hop_ms": round(statistics.median(per_hop) * 1e3, 3) if per_hop else None,
        }
