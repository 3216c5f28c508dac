"""Where a node sits in the pipeline, and how that orders the stages.

Position matters only for memory: the first stage carries the embedding, the
last carries final norm + head, a lone stage carries both. The value of each
role is its tie-break rank (lower is preferred).
"""

from __future__ import annotations

from enum import IntEnum


class Role(IntEnum):
    ALONE = 0
    FIRST = 1
    MIDDLE = 2
    LAST = 3
    IDLE = 4

    @property
    def is_first(self) -> bool:
        return self in (Role.ALONE, Role.FIRST)

    @property
    def is_last(self) -> bool:
        return self in (Role.ALONE, Role.LAST)


def pipeline_order(assignment: list[tuple[str, Role, int]]) -> list[tuple[str, int]]:
    """(node, role, layers) in canonical node order -> (node, layers) in stage order.

    First stage, then middles in the given (canonical) order, then last.
    """
    rank = {Role.ALONE: 0, Role.FIRST: 0, Role.MIDDLE: 1, Role.LAST: 2}
    used = [(node, role, x) for node, role, x in assignment if role is not Role.IDLE]
    used.sort(key=lambda item: rank[item[1]])  # stable: middles keep canonical order
    return [(node, x) for node, _, x in used]
