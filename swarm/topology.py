"""The node's JSON picture of the swarm, for /v1/topology and the dashboard."""

from __future__ import annotations

import time


def topology_snapshot(node) -> dict:
    coordinator, discovery = node.coordinator, node.discovery
    plan = coordinator.plan
    can_serve, status = coordinator.status()
    layers_of = {s.node_id: [s.start, s.end] for s in plan.stages} if plan else {}
    nodes = []
    for peer in discovery.view(include_self=True):
        p, own = peer.profile, peer.node_id == node.node_id
        stats = node.stats.to_dict() if own else node.peer_stats.get(peer.node_id)
        nodes.append({
            "id": p.node_id, "name": p.name, "addresses": list(peer.addresses), "api_port": p.api_port,
            "peer_port": p.peer_port, "backend": p.backend, "memory_total": p.memory_total,
            "memory_available": p.memory_available,
            "memory_used": node.host.weight_bytes if own else int(p.extra.get("mem_used") or 0),
            "speed": p.speed, "state": p.extra.get("state", "joining"), "plan_id": p.extra.get("plan") or None,
            "layers": layers_of.get(p.node_id), "self": own, "model_id": p.model_id,
            "stats": stats or {},
        })
    order = {s.node_id: i for i, s in enumerate(plan.stages)} if plan else {}
    nodes.sort(key=lambda n: (order.get(n["id"], len(order)), n["name"], n["id"]))
    stages = plan.stages if plan else ()
    return {
        "swarm": discovery.profile.swarm, "node_id": node.node_id, "updated_at": time.time(),
        "can_serve": can_serve, "status": status,
        "model": {"id": node.model_id, "n_layers": node.model.n_layers, "fingerprint": node.model.fingerprint},
        "plan": ({**plan.to_dict(), "id": plan.plan_id, "model": node.model_id, "spec": plan.model.to_dict(),
                  "n_layers": node.model.n_layers} if plan else None),
        "nodes": nodes,
        "links": [{"from": a.node_id, "to": b.node_id} for a, b in zip(stages, stages[1:])],
    }
