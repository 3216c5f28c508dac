"""The requests this node is the entry of, and the plan each one runs on now.

A token or an error for a request is only ever sent by a stage of that request's plan
(tokens by its last stage) to the request's entry. So the entry records, before it sends a
request's first frame into a plan, which plan that is and who its stages are; the node's
inbox asks here, on the MLX thread, before a token or an error reaches the waiting client
or starts the next step (node/sender_rules.py).

Written on the event loop (`begin`, `end`), read on the MLX thread: each is one dict operation
on an immutable value, so no lock is needed.
"""

from __future__ import annotations

from typing import NamedTuple

from partitioner import Plan


class OwnRequest(NamedTuple):
    plan_id: str
    stages: frozenset[str]  # node ids of the plan's stages: who may say the request failed
    last: str  # the last stage: who may send its tokens


class OwnRequests:
    def __init__(self) -> None:
        self._requests: dict[str, OwnRequest] = {}

    def begin(self, rid: str, plan: Plan) -> None:
        """`rid` runs on `plan` from now on (event loop; before its first frame is sent)."""
        current = self._requests.get(rid)
        if current is None or current.plan_id != plan.plan_id:
            nodes = [s.node_id for s in plan.stages]
            self._requests[rid] = OwnRequest(plan.plan_id, frozenset(nodes), nodes[-1])

    def end(self, rid: str) -> None:
        """The request left its plan (released, or about to replay elsewhere)."""
        self._requests.pop(rid, None)

    def others_than(self, rid: str) -> bool:
        """Does this entry run a request besides `rid`? (event loop)"""
        return len(self._requests) > (rid in self._requests)

    def get(self, rid: str) -> OwnRequest | None:
        return self._requests.get(rid)
