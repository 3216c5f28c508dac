"""How long a step or a pass may take at the stages' stated speeds: when to suspect a stage of
taking no data (slow_members.py), and how long a probe of it may wait. Pure: no I/O.

A stated speed (seconds per layer per token, decoding) is a claim: a liar's must not put its stage
above suspicion, so both are capped.
"""

from __future__ import annotations

from typing import Mapping

from partitioner import Plan

from ..engine.input_limits import MAX_CHUNK

# A sampled step is overdue after this, plus OVERDUE_FACTOR times what its positions cost. Being
# overdue only has the stages probed (an honest one answers), so the floor may be short.
OVERDUE_FLOOR_S = 1.0
OVERDUE_FACTOR = 4.0
MAX_S = 60.0
# A prompt's position costs a stage at least this many times less than a decoded token's: measured
# 2.4 on a CPU, more on a GPU.
PREFILL_SPEEDUP = 2.0


def overdue_after(plan: Plan, speeds: Mapping[str, float], positions: int) -> float:
    """Seconds after which a sampled step of `plan` that computes `positions` positions is overdue."""
    cost = sum((s.end - s.start) * speeds.get(s.node_id, 0.0) for s in plan.stages) * positions
    return min(OVERDUE_FLOOR_S + OVERDUE_FACTOR * cost, MAX_S)


def longest_pass(plan: Plan | None, node: str, speed: float) -> float:
    """The longest pass `node` may be computing for `plan`: a whole chunk of a prompt through its
    layers (a stage reads its lane between passes only)."""
    for s in plan.stages if plan else ():
        if s.node_id == node:
            return min((s.end - s.start) * speed * MAX_CHUNK / PREFILL_SPEEDUP, MAX_S)
    return 0.0
