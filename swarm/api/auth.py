"""The optional API key: `Authorization: Bearer <key>`, as OpenAI's clients send it, or
`x-api-key: <key>`, as Anthropic's do.

With a key (node/secrets.py, api_key: --api-key, $SWARM_API_KEY or the state dir's `api-key`),
every route but /health answers 401 without it, in the error shape of the API called (errors.py), before anything
else runs: chat and completions, models, the topology and its event stream. /health stays
open (load balancers and peers poll it) and tells a caller without the key only whether the
node can serve (status/node_status.py). Without a key, everything is open, as before.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from .errors import error_response

OPEN_PATHS = frozenset({"/health"})


def bearer_matches(request: web.Request, key: str | None) -> bool:
    """No key set, or the request carries it in either header (compared in constant time)."""
    if not key:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode()):
        return True
    return hmac.compare_digest(request.headers.get("x-api-key", "").strip().encode(), key.encode())


def api_key_middleware(key: str | None):
    @web.middleware
    async def require_api_key(request: web.Request, handler):
        if request.path in OPEN_PATHS or bearer_matches(request, key):
            return await handler(request)
        given = "Authorization" in request.headers or "x-api-key" in request.headers
        response = error_response(
            401, "Incorrect API key provided." if given else
            "You didn't provide an API key. This node requires one: 'Authorization: Bearer <key>' "
            "or 'x-api-key: <key>'.",
            code="invalid_api_key", path=request.path)
        response.headers["WWW-Authenticate"] = 'Bearer realm="swarm"'
        return response
    return require_api_key
