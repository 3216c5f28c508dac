"""The entry's first decode step of a request joins the cohort of steps already out. MLX thread only.

Requests whose prompts were prefilled at different times would otherwise decode as separate
cohorts for the whole stream: each stage batches only the steps that queue up together, and a
cohort that left together comes back together (3.5 rows per pass at 8 streams on three nodes,
8 on one). So while other requests' sampled steps to the same first stage are out, a request's
first decode step is held here, and it leaves with the next of theirs that comes back: the first
stage gets them side by side and batches them (stage/stage_service.py). A request alone never
waits, nor does one already decoding. What is out is counted here, on the thread that sends the
steps and receives their answers, so it cannot go stale: every step out ends with its token, an
error, or its request's release.
"""

from __future__ import annotations

from ..transport.messages import Forward
from .run_ahead import NextStep


class CohortJoin:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._out: dict[str, tuple[str, int]] = {}  # rid -> (first stage, position of the awaited token)
        self._decoding: set[str] = set()  # requests that had a decode step started (never held again)
        self._held: list[NextStep] = []

    def mlx_sent(self, to: str, forward: Forward) -> None:
        """A step left for `to`; one of our requests' sampled steps into a first stage is out."""
        if forward.entry == self.node_id and forward.start == 0 and forward.sampling is not None:
            self._out[forward.rid] = (to, forward.pos + forward.length)

    def mlx_token(self, rid: str, at: int, step: NextStep | None) -> list[NextStep]:
        """Our request's token for position `at` came, with the next step run-ahead made of it (if
        any): the steps to send now, in order."""
        if self._out.get(rid, (None, None))[1] == at:
            del self._out[rid]
        if step is None:
            return self._flush_if_alone()
        joining = rid not in self._decoding
        self._decoding.add(rid)
        if joining and self._others_out(step.to):
            self._held.append(step)
            return []
        held, self._held = self._held, []
        return held + [step]

    def mlx_error(self, rid: str) -> list[NextStep]:
        """Our request failed: its step out will bring no token."""
        self._out.pop(rid, None)
        return self._flush_if_alone()

    def mlx_released(self, rid: str) -> list[NextStep]:
        """Our request ended (or replays from scratch): forget it, drop its held step."""
        self._out.pop(rid, None)
        self._decoding.discard(rid)
        self._held = [h for h in self._held if h.forward.rid != rid]
        return self._flush_if_alone()

    def mlx_flush_if_alone(self) -> list[NextStep]:
        return self._flush_if_alone()

    def _others_out(self, first_stage: str) -> bool:
        return any(to == first_stage for to, _ in self._out.values())

    def _flush_if_alone(self) -> list[NextStep]:
        if not self._held or self._others_out(self._held[0].to):
            return []
        held, self._held = self._held, []
        return held

    @property
    def held(self) -> int:
        return len(self._held)
