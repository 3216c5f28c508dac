"""Parse the node's `/v1/topology` JSON into dataclasses, defensively.

Every field may be missing or of the wrong type (the API is young and other
nodes may run other versions): parsing never raises, it falls back to defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _s(v: Any, default: str = "") -> str:
    return v if isinstance(v, str) else default


def _i(v: Any, default: int | None = None) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def _f(v: Any, default: float | None = None) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def _d(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _l(v: Any) -> list:
    return v if isinstance(v, list) else []


@dataclass
class Stats:
    tokens_per_second: float = 0.0
    active_requests: int = 0
    total_requests: int = 0
    total_tokens: int = 0
    # the stage's prompt cache: finished requests' caches kept for later ones that start the same way
    cache_entries: int = 0
    cache_bytes: int = 0
    cache_hits: int = 0
    cache_tokens_saved: int = 0
    # the entry's speculative decoding: draft tokens its steps carried, and tokens per such step
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    tokens_per_pass: float = 0.0

    @classmethod
    def parse(cls, raw: Any) -> "Stats":
        d = _d(raw)
        pc = _d(d.get("prompt_cache"))
        sp = _d(d.get("speculation"))
        return cls(_f(d.get("tokens_per_second"), 0.0), _i(d.get("active_requests"), 0),
                   _i(d.get("total_requests"), 0), _i(d.get("total_tokens"), 0),
                   _i(pc.get("entries"), 0), _i(pc.get("bytes"), 0), _i(pc.get("hits"), 0),
                   _i(pc.get("tokens_saved"), 0), _i(sp.get("drafts_proposed"), 0),
                   _i(sp.get("drafts_accepted"), 0), _f(sp.get("tokens_per_pass"), 0.0))


@dataclass
class Fetch:
    """A node getting its weights from peers (the node's `fetch` entry); state "" when it never fetched."""
    state: str = ""            # looking | mismatch | fetching | stuck | no_disk | done
    done_bytes: int = 0
    total_bytes: int = 0
    received_bytes: int = 0
    needed_bytes: int = 0
    rate_bps: float = 0.0

    @classmethod
    def parse(cls, raw: Any) -> "Fetch":
        d = _d(raw)
        return cls(_s(d.get("state")), _i(d.get("done_bytes"), 0), _i(d.get("total_bytes"), 0),
                   _i(d.get("received_bytes"), 0), _i(d.get("needed_bytes"), 0), _f(d.get("rate_bps"), 0.0))

    @property
    def active(self) -> bool:
        return self.state in ("looking", "mismatch", "fetching", "stuck", "no_disk")


@dataclass
class NodeInfo:
    id: str
    name: str = ""
    addresses: list[str] = field(default_factory=list)
    api_port: int | None = None
    peer_port: int | None = None
    backend: str = "?"
    memory_total: int | None = None
    memory_available: int | None = None
    memory_kind: str = "ram"  # which memory: "ram", "gpu" (a card's own), "working_set" (Metal's)
    memory_used: int | None = None
    speed: float | None = None          # seconds per layer per token
    state: str = "?"
    layers: tuple[int, int] | None = None  # [start, end)
    is_self: bool = False
    stats: Stats = field(default_factory=Stats)
    fetch: Fetch = field(default_factory=Fetch)

    @classmethod
    def parse(cls, raw: Any) -> "NodeInfo | None":
        d = _d(raw)
        node_id = _s(d.get("id")) or _s(d.get("node_id"))
        if not node_id:
            return None
        layers = _l(d.get("layers"))
        span = None
        if len(layers) == 2 and all(_i(x) is not None for x in layers):
            span = (_i(layers[0]), _i(layers[1]))
        return cls(id=node_id, name=_s(d.get("name")) or node_id,
                   addresses=[a for a in _l(d.get("addresses")) if isinstance(a, str)],
                   api_port=_i(d.get("api_port")), peer_port=_i(d.get("peer_port")),
                   backend=_s(d.get("backend"), "?"), memory_total=_i(d.get("memory_total")),
                   memory_available=_i(d.get("memory_available")), memory_kind=_s(d.get("memory_kind"), "ram"),
                   memory_used=_i(d.get("memory_used")),
                   speed=_f(d.get("speed")), state=_s(d.get("state"), "?"), layers=span,
                   is_self=d.get("self") is True, stats=Stats.parse(d.get("stats")),
                   fetch=Fetch.parse(d.get("fetch")))

    @property
    def address(self) -> str:
        host = self.addresses[0] if self.addresses else "?"
        return f"{host}:{self.api_port}" if self.api_port else host

    def urls(self) -> list[str]:
        """Where this node's HTTP API may be reached."""
        if not self.api_port:
            return []
        return [f"http://{'[' + a + ']' if ':' in a else a}:{self.api_port}" for a in self.addresses]


@dataclass
class StageInfo:
    node_id: str
    start: int
    end: int


@dataclass
class Plan:
    id: str = ""
    model: str = ""
    n_layers: int | None = None
    strategy: str = ""
    stages: list[StageInfo] = field(default_factory=list)
    idle: dict[str, str] = field(default_factory=dict)   # node id -> reason
    bottleneck_s: float | None = None

    @classmethod
    def parse(cls, raw: Any) -> "Plan | None":
        if not isinstance(raw, dict):
            return None
        stages = []
        for s in _l(raw.get("stages")):
            s = _d(s)
            start, end = _i(s.get("start")), _i(s.get("end"))
            if _s(s.get("node_id")) and start is not None and end is not None:
                stages.append(StageInfo(s["node_id"], start, end))
        idle = {_s(x.get("node_id")): _s(x.get("reason"))
                for x in _l(raw.get("idle")) if isinstance(x, dict) and _s(x.get("node_id"))}
        return cls(_s(raw.get("id")), _s(raw.get("model")), _i(raw.get("n_layers")),
                   _s(raw.get("strategy")), stages, idle, _f(raw.get("bottleneck_s")))


@dataclass
class Topology:
    swarm: str = "?"
    node_id: str = ""
    updated_at: float | None = None
    can_serve: bool = False
    status: str = "unknown"
    model_id: str = "?"
    n_layers: int | None = None
    fingerprint: str = ""
    plan: Plan | None = None
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)
    peers_security: str = ""  # "open" (no swarm secret: anyone on the network can join), "secret", "" unknown

    @property
    def open_swarm(self) -> bool:
        return self.peers_security == "open"

    @classmethod
    def parse(cls, raw: Any) -> "Topology":
        d = _d(raw)
        model = _d(d.get("model"))
        nodes = {}
        for n in _l(d.get("nodes")):
            if (info := NodeInfo.parse(n)) is not None:
                nodes[info.id] = info
        links = [(_s(x.get("from")), _s(x.get("to"))) for x in _l(d.get("links"))
                 if isinstance(x, dict) and _s(x.get("from")) and _s(x.get("to"))]
        plan = Plan.parse(d.get("plan"))
        n_layers = _i(model.get("n_layers")) or (plan.n_layers if plan else None)
        return cls(swarm=_s(d.get("swarm"), "?"), node_id=_s(d.get("node_id")),
                   updated_at=_f(d.get("updated_at")), can_serve=d.get("can_serve") is True,
                   status=_s(d.get("status"), "unknown"), model_id=_s(model.get("id"), "?"),
                   n_layers=n_layers, fingerprint=_s(model.get("fingerprint")), plan=plan,
                   nodes=nodes, links=links, peers_security=_s(_d(d.get("security")).get("peers")))

    def name_of(self, node_id: str) -> str:
        n = self.nodes.get(node_id)
        return n.name if n else node_id[:8]

    def pipeline(self) -> list[tuple[NodeInfo, tuple[int, int] | None]]:
        """Nodes holding layers, in stage order, each with its layer range."""
        if self.plan and self.plan.stages:
            out = []
            for st in self.plan.stages:
                node = self.nodes.get(st.node_id) or NodeInfo(id=st.node_id, name=st.node_id[:8], state="unknown")
                out.append((node, (st.start, st.end)))
            return out
        # No plan: whatever nodes report layers, ordered by where their range starts.
        held = [n for n in self.nodes.values() if n.layers is not None]
        return [(n, n.layers) for n in sorted(held, key=lambda n: n.layers[0])]

    def others(self) -> list[tuple[NodeInfo, str]]:
        """Nodes not in the pipeline, with why (the plan's idle reason, else their state)."""
        in_pipe = {n.id for n, _ in self.pipeline()}
        idle = self.plan.idle if self.plan else {}
        return [(n, idle.get(n.id) or n.state) for n in self.nodes.values() if n.id not in in_pipe]

    def urls(self) -> list[str]:
        return [u for n in self.nodes.values() for u in n.urls()]
