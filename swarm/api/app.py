"""The node's HTTP server: OpenAI-compatible chat plus health and models."""

from __future__ import annotations

import time

from aiohttp import web

from ..entry.service import InferenceService
from ..events import EventBus
from ..models.generation_defaults import GenerationDefaults
from ..status.node_status import NodeStatus
from .completions import CompletionRoutes
from .errors import ApiError, error_middleware
from .request_gate import RequestGate
from .topology_routes import TopologyRoutes

MAX_BODY_BYTES = 4 * 1024 * 1024


def make_app(service: InferenceService, status: NodeStatus, events: EventBus, model_id: str,
             defaults: GenerationDefaults | None = None, gate: RequestGate | None = None) -> web.Application:
    """The API sees the inference service (chat) and the status (health, topology), not the node."""
    middlewares = [error_middleware] if gate is None else [error_middleware, gate.middleware]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    CompletionRoutes(service, model_id, defaults).add_to(app)
    model = {"id": model_id, "object": "model", "created": int(time.time()), "owned_by": "swarm"}

    async def models(_request):
        return web.json_response({"object": "list", "data": [model]})

    async def one_model(request):
        if request.match_info["model_id"] != model_id:
            raise ApiError(404, f"model {request.match_info['model_id']!r} is not served here; this swarm serves "
                                f"{model_id!r}", "invalid_request_error", param="model", code="model_not_found")
        return web.json_response(model)

    async def health(_request):
        return web.json_response(status.health(), status=200 if status.can_serve()[0] else 503)

    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model_id:.+}", one_model)  # ids like ORG/NAME hold a slash
    app.router.add_get("/health", health)
    TopologyRoutes(status, events).add_to(app)
    return app
