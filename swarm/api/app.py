"""The node's HTTP server: OpenAI-compatible chat plus health and models."""

from __future__ import annotations

import time

from aiohttp import web

from .completions import CompletionRoutes
from .errors import error_middleware
from .topology_routes import TopologyRoutes

MAX_BODY_BYTES = 4 * 1024 * 1024


def make_app(node) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY_BYTES)
    CompletionRoutes(node).add_to(app)
    started = int(time.time())

    async def models(_request):
        return web.json_response({"object": "list", "data": [
            {"id": node.model_id, "object": "model", "created": started, "owned_by": "swarm"}]})

    async def health(_request):
        return web.json_response(node.health(), status=200 if node.can_serve()[0] else 503)

    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    TopologyRoutes(node).add_to(app)
    return app
