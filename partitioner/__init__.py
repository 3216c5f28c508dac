"""Turn a swarm view (model + nodes) into a pipeline plan.

Pure library: no I/O. Every node runs make_plan on the same inputs and gets
the same Plan, whatever order the nodes were listed in.
"""

from .errors import InsufficientMemoryError
from .links import Link
from .model import IdleNode, ModelSpec, NodeCapacity, Plan, Stage
from .planner import STRATEGIES, make_plan

__all__ = [
    "IdleNode",
    "InsufficientMemoryError",
    "Link",
    "ModelSpec",
    "NodeCapacity",
    "Plan",
    "STRATEGIES",
    "Stage",
    "make_plan",
]
