"""The HTTP API while a node learns its model from its peers: it says what it waits for.

Until the model's small files are in (weights/model_from_peers.py), there is nothing to
chat with: /health and /v1/topology answer 503 with the reason and the fetch's progress,
everything else a 503 naming what the node is doing. The full API replaces it after.
"""

from __future__ import annotations

import time
from typing import Callable

from aiohttp import web

from discovery import Discovery, NodeState

from .auth import ApiAccess, api_key_middleware
from .errors import error_response
from .web_guard import STRANGER, WebGuard, cors_headers


def make_bootstrap_app(state: Callable[[], dict], discovery: Discovery, model: str | None,
                       api_key: ApiAccess | str | None = None, guard: WebGuard | None = None) -> web.Application:
    # web pages first and the topology the key's, as later (app.py)
    app = web.Application(middlewares=([guard.middleware] if guard else []) + [api_key_middleware(api_key)])
    app.on_response_prepare.append(cors_headers)

    def health() -> dict:
        return {**state(), "node_id": discovery.node_id, "model": model or "(whatever the swarm serves)"}

    async def health_route(request):
        if request.get(STRANGER):
            return web.json_response({"status": "unavailable"}, status=503)
        return web.json_response(health(), status=503)

    async def topology(_request):
        now = health()
        nodes = [{"id": p.node_id, "name": p.profile.name, "addresses": list(p.addresses),
                  "api_port": p.profile.api_port, "peer_port": p.profile.peer_port, "backend": p.profile.backend,
                  "memory_total": p.profile.memory_total, "memory_available": p.profile.memory_available,
                  "speed": p.profile.speed, "state": (p.profile.state or NodeState.JOINING).value,
                  "model_id": p.profile.model_id, "self": p.node_id == discovery.node_id, "layers": None,
                  "fetch": now["fetch"] if p.node_id == discovery.node_id else None}
                 for p in discovery.view(include_self=True)]
        return web.json_response({"swarm": discovery.profile.swarm, "node_id": discovery.node_id,
                                  "updated_at": time.time(), "can_serve": False, "status": now["status"],
                                  "model": {"id": model, "n_layers": None, "fingerprint": None},
                                  "plan": None, "nodes": nodes, "links": []}, status=503)

    async def anything_else(request):
        return error_response(503, f"this node is not serving yet: {state()['status']}", "service_unavailable",
                              code="starting", path=request.path)

    app.router.add_get("/health", health_route)
    app.router.add_get("/v1/topology", topology)
    app.router.add_route("*", "/{tail:.*}", anything_else)
    return app
