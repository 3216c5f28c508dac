"""The node profile: what a node tells the swarm about itself.

It travels in two encodings: a DNS-SD TXT record (mDNS) and a JSON object
(the profile exchange, the CLI's event lines). Both round-trip exactly. A node
whose profile may only be told over an authenticated exchange advertises just a
hint over mDNS (`as_hint`): its id and where to ask.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from . import link_costs
from .node_state import NodeState
from .profile_keys import HINT_KEY, STATE_KEY

log = logging.getLogger(__name__)

SERVICE_TYPE = "_swarm._tcp.local."
PROTOCOL_VERSION = 4  # 4: a peer is planned only once it proves the layers it claims (weights/layer_proof.py)
# Versions this build can work with; a peer outside this set is never admitted.
COMPATIBLE_PROTOCOL_VERSIONS = frozenset({4})
BACKENDS = frozenset({"metal", "cpu", "cuda"})
# What memory_total/memory_available count: the host's RAM, a GPU's own memory, Metal's working set.
MEMORY_KINDS = frozenset({"ram", "gpu", "working_set"})

# A DNS TXT string carries at most 255 bytes, "key=value" included.
MAX_TXT_ENTRY = 254
EXTRA_PREFIX = "x."


class MalformedProfile(ValueError):
    """A TXT record or JSON object that is not a valid swarm node profile."""


# TXT key for each field (short keys keep the record small).
_TXT_KEYS = {
    "node_id": "id",
    "name": "name",
    "swarm": "swarm",
    "protocol_version": "pv",
    "model_id": "model",
    "model_fingerprint": "fp",
    "api_port": "api",
    "peer_port": "peer",
    "backend": "be",
    "memory_total": "mt",
    "memory_available": "ma",
    "memory_kind": "mk",
    "speed": "spd",
    "instance": "inst",
    "started_at": "st",
}
_FIELD_BY_TXT_KEY = {v: k for k, v in _TXT_KEYS.items()}


@dataclass(frozen=True)
class NodeProfile:
    node_id: str
    name: str
    swarm: str
    api_port: int
    peer_port: int
    backend: str = "cpu"
    memory_total: int = 0  # bytes
    memory_available: int = 0  # bytes usable for the model (after memory_limit)
    memory_kind: str = "ram"  # which memory those bytes are (MEMORY_KINDS)
    speed: float = 0.0  # seconds per layer per token, measured by the engine
    model_id: str = ""
    model_fingerprint: str = ""
    protocol_version: int = PROTOCOL_VERSION
    # Random per process start: tells a restarted node from its former self and
    # two nodes that wrongly share one node_id apart.
    instance: str = ""
    started_at: float = 0.0  # unix time of process start; the earlier wins id conflicts
    # Free-form fields the caller sets later (plan id, layer range "start-end", ...).
    extra: Mapping[str, str] = field(default_factory=dict, hash=False)
    # What this node measured of its links: peer id -> (round-trip s, bytes/s; 0.0 unknown), snapped to
    # the advertised grid and bounded (link_costs.py).
    links: Mapping[str, tuple[float, float]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))
        problems = []
        try:
            object.__setattr__(self, "links", MappingProxyType(link_costs.checked(self.links, self.node_id)))
        except link_costs.BadLinks as exc:
            problems.append(str(exc))
        if not self.node_id:
            problems.append("empty node_id")
        if not self.swarm:
            problems.append("empty swarm")
        for port_field in ("api_port", "peer_port"):
            port = getattr(self, port_field)
            if not isinstance(port, int) or not 0 <= port <= 65535:
                problems.append(f"{port_field}={port!r} out of range")
        if self.backend not in BACKENDS:
            problems.append(f"backend {self.backend!r} not one of {sorted(BACKENDS)}")
        if self.memory_kind not in MEMORY_KINDS:
            problems.append(f"memory_kind {self.memory_kind!r} not one of {sorted(MEMORY_KINDS)}")
        if not math.isfinite(self.speed) or self.speed < 0:
            problems.append(f"speed {self.speed!r} must be finite and >= 0")
        if self.memory_total < 0 or self.memory_available < 0:
            problems.append("negative memory")
        for key, value in self.extra.items():
            if not isinstance(key, str) or not isinstance(value, str) or not key or "=" in key:
                problems.append(f"extra field {key!r}: keys and values must be strings, keys without '='")
        if STATE_KEY in self.extra and NodeState.parse(self.extra[STATE_KEY]) is None:
            problems.append(f"state {self.extra[STATE_KEY]!r} not one of {[s.value for s in NodeState]}")
        if problems:
            raise MalformedProfile("; ".join(problems))
        for entry_key, entry_value in self._txt_pairs():
            size = len(entry_key.encode()) + 1 + len(entry_value.encode())
            if size > MAX_TXT_ENTRY:
                raise MalformedProfile(f"TXT entry {entry_key!r} is {size} bytes (max {MAX_TXT_ENTRY})")

    # -- TXT ------------------------------------------------------------
    def _txt_pairs(self) -> list[tuple[str, str]]:
        pairs = []
        for field_name, key in _TXT_KEYS.items():
            value = getattr(self, field_name)
            pairs.append((key, repr(value) if isinstance(value, float) else str(value)))
        pairs.extend((EXTRA_PREFIX + k, v) for k, v in sorted(self.extra.items()))
        pairs.extend(link_costs.to_txt(self.links))
        return pairs

    def to_txt(self) -> dict[str, str]:
        """TXT properties for zeroconf's ServiceInfo (every entry < 255 bytes)."""
        return dict(self._txt_pairs())

    @classmethod
    def from_txt(cls, txt: Mapping[bytes | str, bytes | str | None]) -> NodeProfile:
        """Parse a TXT record; raises MalformedProfile for anything that is not ours."""
        values: dict[str, Any] = {}
        extra: dict[str, str] = {}
        links: dict[str, str] = {}
        try:
            for raw_key, raw_value in txt.items():
                key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
                if raw_value is None:
                    continue
                value = raw_value.decode() if isinstance(raw_value, bytes) else raw_value
                if key.startswith(EXTRA_PREFIX):
                    extra[key[len(EXTRA_PREFIX):]] = value
                elif link_costs.is_txt_key(key):
                    links[key] = value
                elif key in _FIELD_BY_TXT_KEY:
                    values[_FIELD_BY_TXT_KEY[key]] = value
        except UnicodeDecodeError as exc:
            raise MalformedProfile(f"undecodable TXT record: {exc}") from exc
        values["extra"] = extra
        try:
            values["links"] = link_costs.to_json(link_costs.from_txt(links))
        except link_costs.BadLinks as exc:
            raise MalformedProfile(str(exc)) from exc
        return cls.from_dict(values)

    # -- JSON -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["extra"] = dict(self.extra)
        data["links"] = link_costs.to_json(self.links)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeProfile:
        """Build from a JSON object or string-valued TXT fields, coercing types."""
        if not isinstance(data, Mapping):
            raise MalformedProfile(f"profile must be an object, got {type(data).__name__}")
        missing = [name for name in ("node_id", "name", "swarm", "api_port", "peer_port") if name not in data]
        if missing:
            raise MalformedProfile(f"missing fields {missing}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        try:
            for name, value in data.items():
                if name not in known:
                    continue  # newer peers may add fields; ignore them
                if name == "extra":
                    if not isinstance(value, Mapping):
                        raise MalformedProfile("extra must be an object")
                    kwargs[name] = _known_state_only({str(k): str(v) for k, v in value.items()}, data)
                elif name == "links":
                    kwargs[name] = {peer: tuple(v) if isinstance(v, list) else v
                                    for peer, v in link_costs.from_json(value).items()}
                elif name in ("api_port", "peer_port", "memory_total", "memory_available", "protocol_version"):
                    kwargs[name] = int(value)
                elif name in ("speed", "started_at"):
                    kwargs[name] = float(value)
                else:
                    kwargs[name] = str(value)
        except MalformedProfile:
            raise
        except link_costs.BadLinks as exc:
            raise MalformedProfile(str(exc)) from exc
        except (TypeError, ValueError) as exc:
            raise MalformedProfile(f"bad field value: {exc}") from exc
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeProfile:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedProfile(f"invalid JSON: {exc}") from exc
        return cls.from_dict(data)

    def as_hint(self) -> NodeProfile:
        """What an mDNS record carries when the real profile is only told over an authenticated
        exchange: who and where to ask, nothing a planner could use (no memory, speed or model)."""
        return NodeProfile(node_id=self.node_id, name=self.name, swarm=self.swarm, api_port=self.api_port,
                           peer_port=self.peer_port, backend=self.backend, protocol_version=self.protocol_version,
                           instance=self.instance, started_at=self.started_at, extra={HINT_KEY: "1"})

    @property
    def state(self) -> NodeState | None:
        """What the node says it is doing (None: it says nothing)."""
        return NodeState.parse(self.extra.get(STATE_KEY))

    @property
    def is_hint(self) -> bool:
        return self.extra.get(HINT_KEY) == "1"

    def replace(self, **changes: Any) -> NodeProfile:
        """A copy with some fields changed; unknown names go into `extra`.

        An extra field set to None is removed.
        """
        known = {f.name for f in dataclasses.fields(self)}
        extra = dict(self.extra)
        extra.update(changes.pop("extra", None) or {})
        for name in [n for n in changes if n not in known]:
            extra[name] = changes.pop(name)
        extra = {k: str(v) for k, v in extra.items() if v is not None}
        if STATE_KEY in extra and NodeState.parse(extra[STATE_KEY]) is None:
            raise ValueError(f"unknown node state {extra[STATE_KEY]!r}: one of {[s.value for s in NodeState]}")
        return dataclasses.replace(self, extra=extra, **changes)


_said_unknown: set[str] = set()


def _known_state_only(extra: dict[str, str], data: Mapping[str, Any]) -> dict[str, str]:
    """A peer's extra fields without a state this build does not know (a newer peer's, or garbage):
    the profile is taken as saying no state, and the first few such states are logged."""
    state = extra.get(STATE_KEY)
    if state is None or NodeState.parse(state) is not None:
        return extra
    if len(_said_unknown) < 16 and state not in _said_unknown:
        _said_unknown.add(state)
        log.warning("node %s says it is in state %r, which this build does not know: taken as no state",
                    str(data.get("node_id"))[:64], state[:64])
    return {k: v for k, v in extra.items() if k != STATE_KEY}


def belongs_to_swarm(profile: NodeProfile, swarm: str) -> bool:
    """Whether `profile` is a node we may work with in `swarm`."""
    return profile.swarm == swarm and profile.protocol_version in COMPATIBLE_PROTOCOL_VERSIONS
