"""The entry node's next decode step, started by its MLX thread the moment the token is in.

Without this, a token travels: data lane (MLX thread) -> event loop -> generation
loop -> event loop -> MLX thread, two thread wake-ups before the next step can
leave, and the client's HTTP write in between. With it, the generation loop arms
each step ("when the token at position `at` comes, go on unless it is one of
these"), the MLX thread starts that step as soon as the token arrives, and the
generation loop, when it gets there, finds the step under way and only waits for
its token. Same messages, same positions, same sampling: the output cannot differ,
only the wait shrinks.

Shared by the event loop and the MLX thread, hence the lock and the `mlx_` name.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ..engine.sampling import SamplingParams
from ..transport.messages import Forward, Token


@dataclass(frozen=True)
class _Armed:
    plan_id: str
    at: int  # position of the awaited token, which is also the next step's position
    sampling: SamplingParams
    stop_ids: frozenset[int]
    first_stage: str  # node id the next step goes to
    with_ids: bool  # the request has decoding rules: its steps carry their token ids
    attempt: int = 0


@dataclass(frozen=True)
class _Launched:
    plan_id: str
    pos: int
    token: int
    started: float  # perf_counter() when the step left: the step's time is measured from here


@dataclass(frozen=True)
class NextStep:
    to: str  # the first stage's node id
    forward: Forward
    started: float


class RunAhead:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._lock = threading.Lock()
        self._armed: dict[str, _Armed] = {}
        self._launched: dict[str, _Launched] = {}

    # -- event loop -------------------------------------------------------
    def arm(self, rid: str, plan_id: str, at: int, sampling: SamplingParams, stop_ids: frozenset[int],
            first_stage: str, with_ids: bool = False, attempt: int = 0) -> None:
        with self._lock:
            self._armed[rid] = _Armed(plan_id, at, sampling, stop_ids, first_stage, with_ids, attempt)

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
    def mlx_next_step(self, token: Token) -> NextStep | None:
        """For a token that just arrived: the armed next step, if any (it is taken: started once)."""
        with self._lock:
            armed = self._armed.get(token.rid)
            if (armed is None or token.token in armed.stop_ids
                    or (token.plan_id, token.at, token.attempt) != (armed.plan_id, armed.at, armed.attempt)):
                return None
            del self._armed[token.rid]
            started = time.perf_counter()
            self._launched[token.rid] = _Launched(armed.plan_id, armed.at, token.token, started)
        forward = Forward.of_tokens(token.rid, armed.plan_id, armed.at, self.node_id, armed.sampling, [token.token],
                                    with_ids=armed.with_ids, attempt=armed.attempt)
        return NextStep(armed.first_stage, forward, started)
