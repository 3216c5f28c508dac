"""Everything a node is told at start, from the command line or a test."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import environment

DEFAULT_API_PORT = 8800
DEFAULT_PEER_PORT = 8801
# Decode steps of up to this many requests run as one pass at a stage: at 16 streams one pass of 16 rows
# beats two cohorts of 8 (docs/performance.md).
DEFAULT_BATCH_DECODE = 16
# An idle first stage waits this long after each new prompt for more to share its pass (stage_service.py).
DEFAULT_PROMPT_GATHER_MS = 3.0
# Positions per prompt chunk (entry/generate.py): what a long prompt holds other requests back at a stage.
# Its default is the backend's (backend.py: Backend.prefill_chunk).
MIN_PREFILL_CHUNK, MAX_PREFILL_CHUNK = 16, 2048  # (engine/input_limits.py: a stage takes no bigger chunk)
DEFAULT_TOKEN_TIMEOUT = 120.0  # last-resort bound on one step (or prompt chunk) when no failure is seen
# Admission at an entry node (api/admission.py): one full batch of active requests; the queue holds
# only prompt ids.
DEFAULT_MAX_ACTIVE = 16
DEFAULT_MAX_QUEUE = 64
# The prompt cache a stage keeps by default, at most (of what the plan leaves free): ten turns of a long
# conversation with the default model hold ~80 MB over all its layers.
AUTO_PROMPT_CACHE = 512 << 20


def default_state_dir() -> Path:
    base = environment.XDG_STATE_HOME.get() or Path.home() / ".local" / "state"
    return Path(base).expanduser() / "swarm"


@dataclass
class NodeConfig:
    model: str | None = None  # None: the built-in default model; an id no local path names: fetched from peers
    join: bool = False  # serve whatever model the swarm serves, fetched from peers
    api_host: str = "0.0.0.0"
    api_port: int = DEFAULT_API_PORT
    peer_host: str = "0.0.0.0"
    peer_port: int = DEFAULT_PEER_PORT
    state_dir: Path = field(default_factory=default_state_dir)
    cache_dir: Path | None = None  # None: $SWARM_CACHE_DIR / XDG cache
    node_id: str | None = None  # None: kept in state_dir
    name: str | None = None  # display name; None: the host name
    dtype: str = "auto"  # weights dtype: auto = float32 on CPU, as stored on Metal
    dequantize: bool = False  # quantized layers loaded as `dtype` floats (faster CPU prefill, more memory)
    default_max_tokens: int = 512
    # sampling for fields a request leaves out; None: the model's generation_config.json, else greedy
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    # swarm membership
    swarm: str = "default"
    secret: str | None = None  # --secret; None: $SWARM_SECRET, else the state dir's `secret` file, else open
    interfaces: list[str] | None = None  # None: every interface (the user default)
    peers: list[tuple[str, int]] = field(default_factory=list)  # static peers (host, peer port)
    mdns: bool = True
    memory_limit: int | None = None  # bytes offered to the model; None: what is available
    speed: float | None = None  # seconds per layer per token; None: measured (and cached)
    strategy: str = "balanced"
    kv_reserve_tokens: int = 4096  # KV cache room reserved per layer when planning
    # bytes of finished requests' caches a stage keeps for later ones (engine/prompt_cache.py): taken off the
    # memory offered to the planner; None: what the plan leaves of the offered memory, up to AUTO_PROMPT_CACHE
    prompt_cache: int | None = None
    recovery_timeout: float = 30.0  # how long a request waits for a whole pipeline
    token_timeout: float = DEFAULT_TOKEN_TIMEOUT
    prefill_chunk: int | None = None  # positions per prompt chunk; None: the backend's (backend.py)
    speculate: str = "auto"  # draft tokens in decode steps (entry/speculation.py): off, lookup, draft, auto
    draft_model: str | None = None  # a local model the entry drafts with (entry/draft_model.py)
    batch_decode: int = DEFAULT_BATCH_DECODE  # most decode steps of different requests run as one pass (1: never)
    prompt_gather_ms: float = DEFAULT_PROMPT_GATHER_MS  # a burst's prompts share a pass (0: never wait)
    max_active: int = DEFAULT_MAX_ACTIVE  # requests this node generates for at once, as their entry
    max_queue: int = DEFAULT_MAX_QUEUE  # requests waiting for a slot; beyond that, 429
    # the HTTP API
    api_key: str | None = None  # --api-key; None: $SWARM_API_KEY, else the state dir's api-key, else none
    http_timeout: float = 30.0  # a request's headers and body must arrive within this; idle connections close
    # web pages (origins) that may call the API besides loopback ones and names (Host) it answers to besides
    # this machine's own (api/origins.py, api/hosts.py)
    allowed_origins: list[str] = field(default_factory=list)
    allowed_hosts: list[str] = field(default_factory=list)
    http_connections_per_address: int = 64
