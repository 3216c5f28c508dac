"""The entry node's next decode step, started by its MLX thread the moment the token is in.

Without this, a token travels: data lane (MLX thread) -> event loop -> generation
loop -> event loop -> MLX thread, two thread wake-ups before the next step can
leave, and the client's HTTP write in between. With it, the generation loop arms
each step ("when the token at position `at` comes, go on unless it is one of
these"), the MLX thread starts that step as soon as the token arrives (when the
entry is also the first stage), and the generation loop, when it gets there,
finds the step under way and only waits for its token. Same frames, same
positions, same sampling: the output cannot differ, only the wait shrinks.

Shared by the event loop and the MLX thread, hence the lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from ..transport.frames import Frame
from . import messages as msg


@dataclass(frozen=True)
class _Armed:
    plan_id: str
    at: int  # position of the awaited token, which is also the next step's position
    sampling: dict
    stop_ids: frozenset[int]


@dataclass(frozen=True)
class _Launched:
    plan_id: str
    pos: int
    token: int
    started: float  # perf_counter() when the step left: the step's time is measured from here


class RunAhead:
    # added to a token's header when its next step was started: when (perf_counter)
    NEXT_STARTED = "next_started"

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._lock = threading.Lock()
        self._armed: dict[str, _Armed] = {}
        self._launched: dict[str, _Launched] = {}

    # -- event loop -------------------------------------------------------
    def arm(self, rid: str, plan_id: str, at: int, sampling: dict, stop_ids: frozenset[int]) -> None:
        with self._lock:
            self._armed[rid] = _Armed(plan_id, at, sampling, stop_ids)

    def started(self, rid: str, plan_id: str, pos: int, tokens: list[int]) -> float | None:
        """When this very step was started by the MLX thread (None: not started, send it)."""
        with self._lock:
            launched = self._launched.pop(rid, None)
        if launched is None or (launched.plan_id, launched.pos, [launched.token]) != (plan_id, pos, tokens):
            return None
        return launched.started

    def forget(self, rid: str) -> None:
        with self._lock:
            self._armed.pop(rid, None)
            self._launched.pop(rid, None)

    # -- MLX thread -------------------------------------------------------
    def started_at(self, rid: str) -> float | None:
        with self._lock:
            launched = self._launched.get(rid)
        return launched.started if launched else None

    def next_step(self, token_header: dict) -> Frame | None:
        """For a token that just arrived: the forward frame of the armed next step, if any."""
        rid, token = token_header.get("rid"), token_header.get("token")
        with self._lock:
            armed = self._armed.get(rid)
            if (armed is None or not isinstance(token, int) or token in armed.stop_ids
                    or (token_header.get("plan"), token_header.get("at")) != (armed.plan_id, armed.at)):
                return None
            del self._armed[rid]
            self._launched[rid] = _Launched(armed.plan_id, armed.at, token, time.perf_counter())
        header = {**msg.forward(rid, armed.plan_id, armed.at, 0, self.node_id, armed.sampling),
                  "dtype": "int32", "shape": [1, 1]}
        return Frame(header, np.asarray([[token]], dtype=np.int32).tobytes())
