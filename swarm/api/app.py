"""The node's HTTP server: OpenAI-compatible chat plus health and models.

Hardened for a network with strangers on it: an optional API key (auth.py), bodies of at
most MAX_BODY_BYTES that must arrive within the HTTP timeout (request_parsing.py), and,
set where the server is run (node.py): a connection that sends no complete request within
that timeout is closed (aiohttp's keep-alive timeout, which also covers unfinished
headers), and at most so many connections per address (connection_cap.py).
"""

from __future__ import annotations

import time

from aiohttp import web

from ..entry.service import InferenceService
from ..events import EventBus
from ..status.node_status import NodeStatus
from .admission import Admission
from .auth import api_key_middleware, bearer_matches
from .completions import CompletionRoutes
from .errors import error_middleware
from .request_parsing import BODY_TIMEOUT, BODY_TIMEOUT_S
from .topology_routes import TopologyRoutes

MAX_BODY_BYTES = 4 * 1024 * 1024


def make_app(service: InferenceService, status: NodeStatus, events: EventBus, model_id: str,
             admission: Admission, *, api_key: str | None = None,
             body_timeout: float = BODY_TIMEOUT_S) -> web.Application:
    """The API sees the inference service (chat) and the status (health, topology), not the node."""
    app = web.Application(middlewares=[api_key_middleware(api_key), error_middleware],
                          client_max_size=MAX_BODY_BYTES)
    app[BODY_TIMEOUT] = body_timeout
    CompletionRoutes(service, model_id, admission).add_to(app)
    started = int(time.time())

    async def models(_request):
        return web.json_response({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": started, "owned_by": "swarm"}]})

    async def health(request):
        authorized = bearer_matches(request, api_key)
        body = status.health(authorized=authorized)
        if authorized:  # like the rest of the details, only for a caller with the key
            body["admission"] = admission.status()
        return web.json_response(body,
                                 status=200 if status.can_serve()[0] else 503)

    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    TopologyRoutes(status, events).add_to(app)
    return app
