"""The node's HTTP server: OpenAI-compatible chat plus health and models."""

from __future__ import annotations

import time

from aiohttp import web

from ..entry.service import InferenceService
from ..events import EventBus
from ..status.node_status import NodeStatus
from .admission import Admission
from .completions import CompletionRoutes
from .errors import error_middleware
from .topology_routes import TopologyRoutes

MAX_BODY_BYTES = 4 * 1024 * 1024


def make_app(service: InferenceService, status: NodeStatus, events: EventBus, model_id: str,
             admission: Admission) -> web.Application:
    """The API sees the inference service (chat) and the status (health, topology), not the node."""
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY_BYTES)
    CompletionRoutes(service, model_id, admission).add_to(app)
    started = int(time.time())

    async def models(_request):
        return web.json_response({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": started, "owned_by": "swarm"}]})

    async def health(_request):
        return web.json_response({**status.health(), "admission": admission.status()},
                                 status=200 if status.can_serve()[0] else 503)

    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    TopologyRoutes(status, events).add_to(app)
    return app
