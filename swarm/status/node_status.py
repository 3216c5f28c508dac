"""What a node says about itself and the swarm: /health and /v1/topology. Event loop.

Both say how the node is secured ("security"). With an API key set, /health tells a caller
without it only whether the node can serve, how it is secured, and its request counters
(which peers poll for their topology, sending no key: peer_stats.py); node ids, plans,
layers and connections are for those with the key.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

from discovery import Discovery, NodeState
from discovery.profile_keys import FETCH_KEY, MEM_USED_KEY, PLAN_KEY

from ..backend import Backend
from ..engine.blas import blas_in_use
from ..entry.hop_timing import HopTiming
from ..entry.stats import RequestStats
from ..models.resolve import LocalModel
from ..planning.coordinator import Coordinator
from ..stage.stage_host import StageHost
from ..stage.stage_service import StageService
from ..transport.links import PeerLinks
from ..weights.peer_weights import PeerWeights, parse_fetch
from .peer_stats import PeerStats


class NodeStatus:
    def __init__(self, model: LocalModel, backend: Backend, discovery: Discovery, coordinator: Coordinator,
                 host: StageHost, stage_service: StageService, links: PeerLinks, stats: RequestStats,
                 hop_timing: HopTiming, peer_stats: PeerStats, weights: PeerWeights, *, api_key: bool = False,
                 peers: dict | None = None, prompt_chunk: int = 0, speculation: Callable[[], dict] | None = None,
                 paths=None):
        """`paths`: node/path_choice.py's PathChoice (/health's peer_paths), None: not reported."""
        self.model, self.backend, self.discovery, self.coordinator = model, backend, discovery, coordinator
        self.peers_security = peers or {"peers": "open"}  # node/peer_security.py, describe
        self.host, self.stage_service, self.links = host, stage_service, links
        self.stats, self.hop_timing, self.peer_stats = stats, hop_timing, peer_stats
        self.weights, self.paths = weights, paths
        self.api_key = api_key
        self.prompt_chunk = prompt_chunk  # positions per chunk of the prompts this entry sends
        self.speculation = speculation or (lambda: {"mode": "off"})  # what this entry's requests drafted

    @functools.cached_property
    def blas(self) -> str:
        """Read once: the process's BLAS does not change, and reading it is not free."""
        return blas_in_use()

    def can_serve(self) -> tuple[bool, str]:
        return self.coordinator.status()

    def security(self) -> dict:
        """The peers' half (node/peer_security.py, describe: an open swarm said loudly) and the API's."""
        return {**self.peers_security, "api_key": self.api_key}

    def health(self, authorized: bool = True) -> dict:
        ok, reason = self.can_serve()
        if not authorized:
            return {"status": "ok" if ok else "unavailable", "security": self.security(), **self.stats.to_dict(),
                    "prompt_cache": self.prompt_cache()}
        runner, plan, service = self.host.runner, self.coordinator.plan, self.stage_service
        return {"status": "ok" if ok else reason, "security": self.security(), "node_id": self.discovery.node_id,
                "model": self.model.model_id,
                "backend": self.backend.kind, "device": self._device(), "blas": self.blas, "plan_id": plan.plan_id if plan else None,
                "layers": [runner.range.start, runner.range.end] if runner else None,
                "weights": runner.shard.weights_run_as if runner else None,
                "cached_requests": runner.active_requests if runner else 0,
                "cached_kv_bytes": runner.kv_bytes if runner else 0,
                "prompt_cache": self.prompt_cache(),
                "refused_frames": service.refusals.count, **self.stats.to_dict(),
                "decode_timing": self.hop_timing.to_dict(), "speculation": self.speculation(),
                "decode_batching": {"max_batch": service.max_batch, "batched_passes": service.batched_passes,
                                    "batched_rows": service.batched_rows, "prompt_passes": service.prompt_passes,
                                    "prompt_rows": service.prompt_rows,
                                    "kept_passes": runner.batches.reused if runner else 0,
                                    "ahead_taken": runner.ahead.taken if runner else 0,
                                    "ahead_undone": runner.ahead.undone if runner else 0,
                                    "prompt_chunk": self.prompt_chunk, "prompt_chunks_held": service.hold.held},
                "peer_connections": self.links.snapshot(),
                **({"peer_paths": self.paths.snapshot()} if self.paths is not None else {}), "fetch": self.weights.status.to_dict()}

    def _device(self) -> dict:
        """The backend's device and the memory this node offers the swarm (its profile's, after --memory-limit)."""
        p = self.discovery.profile
        return {**self.backend.to_dict(), "memory_offered": p.memory_available, "memory_total": p.memory_total}

    def prompt_cache(self) -> dict:
        """This node's stage's prompt cache (engine/prompt_cache.py): its budget, entries, bytes, hits,
        misses and the positions hits did not compute. Counters only: no tokens, no entry's name."""
        runner = self.host.runner
        if runner is None:
            return {"max_bytes": 0, "entries": 0, "bytes": 0, "hits": 0, "misses": 0, "tokens_saved": 0}
        return {"max_bytes": runner.prompts.max_bytes, **runner.prompt_stats().to_dict()}

    def topology(self) -> dict:
        self.peer_stats.watched()
        coordinator, discovery, model = self.coordinator, self.discovery, self.model
        plan = coordinator.plan
        can_serve, status = coordinator.status()
        layers_of = {s.node_id: [s.start, s.end] for s in plan.stages} if plan else {}
        nodes = []
        for peer in discovery.view(include_self=True):
            p, own = peer.profile, peer.node_id == discovery.node_id
            stats = {**self.stats.to_dict(), "prompt_cache": self.prompt_cache(),
                     "speculation": self.speculation()} if own else \
                self.peer_stats.get(peer.node_id)
            nodes.append({
                "id": p.node_id, "name": p.name, "addresses": list(peer.addresses), "api_port": p.api_port,
                "peer_port": p.peer_port, "backend": p.backend, "memory_total": p.memory_total,
                "memory_available": p.memory_available, "memory_kind": p.memory_kind,
                "memory_used": self.host.weight_bytes if own else int(p.extra.get(MEM_USED_KEY) or 0),
                "speed": p.speed, "measured_links": {peer: {"rtt_s": rtt, "bytes_per_s": bw}
                                                     for peer, (rtt, bw) in p.links.items()},
                "state": (p.state or NodeState.JOINING).value, "plan_id": p.extra.get(PLAN_KEY) or None,
                "layers": layers_of.get(p.node_id), "self": own, "model_id": p.model_id,
                "stats": stats or {},
                "fetch": self.weights.status.to_dict() if own else parse_fetch(p.extra.get(FETCH_KEY)),
                "holds": list(held) if (held := coordinator.gate.claims(p)) else None,
                "proven": None if own else coordinator.gate.proven(p),
            })
        order = {s.node_id: i for i, s in enumerate(plan.stages)} if plan else {}
        nodes.sort(key=lambda n: (order.get(n["id"], len(order)), n["name"], n["id"]))
        stages = plan.stages if plan else ()
        return {
            "swarm": discovery.profile.swarm, "node_id": discovery.node_id, "updated_at": time.time(),
            "can_serve": can_serve, "status": status, "security": self.security(),
            "model": {"id": model.model_id, "n_layers": model.n_layers, "fingerprint": model.fingerprint},
            "plan": ({**plan.to_dict(), "id": plan.plan_id, "model": model.model_id, "spec": plan.model.to_dict(),
                      "n_layers": model.n_layers} if plan else None),
            "nodes": nodes,
            "links": [{"from": a.node_id, "to": b.node_id} for a, b in zip(stages, stages[1:])],
            "proofs": coordinator.proofs.status() if coordinator.proofs is not None else None,
        }
