"""Who may use the API: `Authorization: Bearer <key>`, as OpenAI's clients send it, or
`x-api-key: <key>`, as Anthropic's do.

A key comes from --api-key, $SWARM_API_KEY or the state dir's `api-key` (node/secrets.py);
a swarm with a secret and none of them gets one derived from the secret
(node/secrets.py: api_key_from_secret), so a closed swarm's API is closed too. With a key, every
route but /health answers 401 without it, in the error shape of the API called (errors.py),
before anything else runs: chat and completions, models, the topology and its event stream.
/health stays open (load balancers and peers poll it) and tells a caller without the key only
whether the node can serve (status/node_status.py).

A derived key spares clients on the node's own machine (local_client.py), so a closed swarm
keeps working with `curl localhost` as an open one does. A key given explicitly is
required of everyone. Without any key, everything is open.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from aiohttp import web

from .errors import error_response
from .local_client import on_this_machine

OPEN_PATHS = frozenset({"/health"})


@dataclass(frozen=True)
class ApiAccess:
    key: str | None = None
    local_without_key: bool = False  # clients on this machine need no key (a key derived from the secret)


def _as_access(access: ApiAccess | str | None) -> ApiAccess:
    return access if isinstance(access, ApiAccess) else ApiAccess(access)


def authorized(request: web.Request, access: ApiAccess | str | None) -> bool:
    """No key set, a local client where that is enough, or the request carries the key in either header
    (compared in constant time)."""
    access = _as_access(access)
    if not access.key or (access.local_without_key and on_this_machine(request.transport)):
        return True
    key = access.key.encode()
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key):
        return True
    return hmac.compare_digest(request.headers.get("x-api-key", "").strip().encode(), key)


def api_key_middleware(access: ApiAccess | str | None):
    access = _as_access(access)

    @web.middleware
    async def require_api_key(request: web.Request, handler):
        if request.path in OPEN_PATHS or authorized(request, access):
            return await handler(request)
        given = "Authorization" in request.headers or "x-api-key" in request.headers
        response = error_response(
            401, "Incorrect API key provided." if given else
            "You didn't provide an API key. This node requires one: 'Authorization: Bearer <key>' "
            "or 'x-api-key: <key>' (`swarm-node --print-api-key` on a node's machine prints it).",
            code="invalid_api_key", path=request.path)
        response.headers["WWW-Authenticate"] = 'Bearer realm="swarm"'
        return response
    return require_api_key
