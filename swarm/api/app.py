"""The node's HTTP server: OpenAI-compatible chat and Responses, Ollama's API, plus health and models.

Hardened for a network with strangers on it: an API key, optional in an open swarm (auth.py), bodies of at
most MAX_BODY_BYTES that must arrive within the HTTP timeout (request_parsing.py), and,
set where the server is run (node/node.py): a connection that sends no complete request within
that timeout is closed (aiohttp's keep-alive timeout, which also covers unfinished
headers), and at most so many connections per address (connection_cap.py).
"""

from __future__ import annotations

import time

from aiohttp import web

from ..entry.service import InferenceService
from ..events import EventBus
from ..models.generation_defaults import GenerationDefaults
from ..status.node_status import NodeStatus
from .admission import Admission
from .anthropic_routes import AnthropicRoutes
from .auth import ApiAccess, api_key_middleware, authorized
from .completions import CompletionRoutes
from .errors import ApiError, error_middleware
from .generation import Generation
from .ollama_models import OllamaModel
from .ollama_routes import OllamaRoutes
from .request_fields import ignored_header
from .request_gate import RequestGate
from .request_parsing import BODY_TIMEOUT, BODY_TIMEOUT_S
from .responses_routes import ResponsesRoutes
from .topology_routes import TopologyRoutes
from .web_guard import STRANGER, WebGuard, cors_headers

MAX_BODY_BYTES = 4 * 1024 * 1024


def make_app(service: InferenceService, status: NodeStatus, events: EventBus, model_id: str,
             admission: Admission, defaults: GenerationDefaults | None = None, gate: RequestGate | None = None,
             *, api_key: ApiAccess | str | None = None, body_timeout: float = BODY_TIMEOUT_S,
             guard: WebGuard | None = None) -> web.Application:
    """The API sees the inference service (chat) and the status (health, topology), not the node."""
    # Web pages first (a stranger's page learns nothing and starts nothing: web_guard.py), then the key
    # (a request without it learns nothing, not even that the node is stopping), then errors in
    # OpenAI's shape, then the gate (a 503 once the node stops taking requests).
    middlewares = (([guard.middleware] if guard else []) + [api_key_middleware(api_key), error_middleware]
                   + ([gate.middleware] if gate else []))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[BODY_TIMEOUT] = body_timeout
    app.on_response_prepare.append(ignored_header)
    app.on_response_prepare.append(cors_headers)
    generation = Generation(service, model_id, admission, defaults)
    CompletionRoutes(generation).add_to(app)
    AnthropicRoutes(generation).add_to(app)
    ResponsesRoutes(generation).add_to(app)
    template = getattr(service.tokenizer, "chat_template", None)
    OllamaRoutes(generation, OllamaModel(model_id, status.model, template if isinstance(template, str) else None)
                 ).add_to(app)
    model = {"id": model_id, "object": "model", "created": int(time.time()), "owned_by": "swarm"}

    async def models(_request):
        return web.json_response({"object": "list", "data": [model]})

    async def one_model(request):
        if request.match_info["model_id"] != model_id:
            raise ApiError(404, f"model {request.match_info['model_id']!r} is not served here; this swarm serves "
                                f"{model_id!r}", "invalid_request_error", param="model", code="model_not_found")
        return web.json_response(model)

    async def health(request):
        if request.get(STRANGER):  # a page of another site, or a re-pointed name: whether it serves, no more
            ok = status.can_serve()[0]
            return web.json_response({"status": "ok" if ok else "unavailable"}, status=200 if ok else 503)
        allowed = authorized(request, api_key)
        body = status.health(authorized=allowed)
        if allowed:  # like the rest of the details, only for a caller with the key
            body["admission"] = admission.status()
        return web.json_response(body,
                                 status=200 if status.can_serve()[0] else 503)

    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model_id:.+}", one_model)  # ids like ORG/NAME hold a slash
    app.router.add_get("/health", health)
    TopologyRoutes(status, events).add_to(app)
    return app
