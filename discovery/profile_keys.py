"""The extra fields of a node's profile that the swarm reads, each named once, here.

A profile carries them as strings in `extra` (profile.py); a node sets them with
`Discovery.update_profile(extra={KEY: value})`, None removing one.
"""

from __future__ import annotations

STATE_KEY = "state"  # what the node is doing: a node_state.NodeState
PLAN_KEY = "plan"  # the plan it serves ("" for none): an announcement is a promise to serve it
READY_KEY = "ready"  # the plan whose weights it holds, while the plan's other members fetch theirs
LOADING_KEY = "loading"  # the plan it fetches or loads layers for (what load deadlines count from)
FETCH_KEY = "fetch"  # its weight fetch's progress, as the swarm encodes it
LAYERS_KEY = "layers"  # the layers it serves, "start-end"
MEM_USED_KEY = "mem_used"  # bytes its weights take
HOLDS_KEY = "holds"  # the layers it says it holds, "start-end" (what peers challenge it over before planning it)
HINT_KEY = "hint"  # "1": an mDNS record that only names an endpoint (NodeProfile.as_hint)
