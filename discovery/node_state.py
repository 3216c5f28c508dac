"""What a node is doing, as its profile tells the swarm (the `state` extra field, profile_keys.py).

One closed set: a node writes only these, a peer's profile with any other state is taken
without it (NodeProfile.from_dict logs it), and a typo in our own code fails where it is made.
"""

from __future__ import annotations

from enum import StrEnum


class NodeState(StrEnum):
    LOOKING = "looking"  # has no model yet: waits for a peer that serves one
    MISMATCH = "mismatch"  # the peers' manifests of the model do not match its fingerprint
    FETCHING = "fetching"  # fetching weights (or the model's small files) from peers
    STUCK = "stuck"  # a fetch no peer could finish: tried again
    NO_DISK = "no_disk"  # not enough disk for the weights it must fetch
    JOINING = "joining"  # knows its model, has no plan yet
    WAITING = "waiting"  # no plan: the swarm cannot hold the model (yet)
    LOADING = "loading"  # loading its layers of the plan
    IDLE = "idle"  # in the swarm, holds no layers of the plan
    FAILED = "failed"  # could not load its layers
    SERVING = "serving"  # serves its layers of the plan it announces

    @classmethod
    def parse(cls, value: str | None) -> NodeState | None:
        """The state a profile names; None when it names none or one this build does not know."""
        try:
            return cls(value) if value is not None else None
        except ValueError:
            return None
