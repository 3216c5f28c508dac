"""Zero-configuration peer discovery for the swarm (zeroconf + node profiles).

Knows nothing of inference: it must not import from `swarm` or MLX.
"""

from .discovery import Discovery
from .liveness import serve_liveness_port
from .local_profile import build_local_profile
from .node_id import load_or_mint_node_id
from .node_state import NodeState
from .profile import PROTOCOL_VERSION, SERVICE_TYPE, MalformedProfile, NodeProfile, belongs_to_swarm
from .profile_exchange import MAGIC, ProfileExchangeError, answer_profile_request, fetch_profile
from .view import PeerEvent, PeerInfo

__all__ = [
    "Discovery", "NodeProfile", "PeerEvent", "PeerInfo", "MalformedProfile", "ProfileExchangeError",
    "PROTOCOL_VERSION", "SERVICE_TYPE", "MAGIC", "belongs_to_swarm", "build_local_profile",
    "load_or_mint_node_id", "fetch_profile", "answer_profile_request", "serve_liveness_port",
]
