"""The API's guard against web pages: a stranger's page gets a 403 before anything runs, an allowed
one gets CORS answers, preflight included.

Runs first, before the API key, the body or any queue: a request from a page whose origin is not
allowed (origins.py), one that names a host that is not this node's (hosts.py: DNS rebinding), and a
page's request that hides its origin (`Sec-Fetch-Site: cross-site` without `Origin`: an <img> or a
<script> loaded by another site) are answered 403 in the error shape of the API called. /health
answers them too, but only whether the node can serve, and no page may read it.
"""

from __future__ import annotations

from aiohttp import web

from .errors import error_response
from .hosts import HostPolicy
from .origins import OriginPolicy

HEALTH = "/health"
METHODS = "GET, POST, DELETE, OPTIONS"
# What the official clients send (OpenAI's and Anthropic's SDKs in a browser, Ollama's), beside the
# content type and the key.
CLIENT_HEADERS = ("authorization", "content-type", "x-api-key", "anthropic-version", "anthropic-beta",
                  "anthropic-dangerous-direct-browser-access", "openai-organization", "openai-project",
                  "openai-beta", "idempotency-key", "x-stainless-*")
EXPOSED = "x-request-id, x-swarm-ignored, retry-after, openai-processing-ms"
PREFLIGHT_MAX_AGE_S = "600"
FOREIGN_FETCH_SITES = frozenset({"cross-site", "same-site"})
ALLOWED_ORIGIN = "swarm_allowed_origin"
STRANGER = "swarm_web_stranger"  # a request the guard refused, let through to /health alone


class WebGuard:
    def __init__(self, origins: OriginPolicy, hosts: HostPolicy):
        self.origins, self.hosts = origins, hosts

    @classmethod
    def for_node(cls, api_port: int, allowed_origins: list[str], allowed_hosts: list[str]) -> WebGuard:
        hosts = HostPolicy(allowed_hosts)
        return cls(OriginPolicy(api_port, hosts, allowed_origins), hosts)

    def refusal(self, request: web.Request) -> str | None:
        """Why this request is refused, or None."""
        if not self.hosts.allows(request.headers.get("Host")):
            return (f"Host {request.headers.get('Host')!r} is not one of this node's names or addresses "
                    "(a page re-pointing its own name here: DNS rebinding); a name this node goes by is "
                    "allowed with --allowed-hosts NAME")
        origin = request.headers.get("Origin")
        if origin is not None and not self.origins.allows(origin):
            return (f"web pages from {origin} may not use this node's API; an app of yours is allowed with "
                    f"--allowed-origins {origin if origin != 'null' else 'ORIGIN'}")
        if origin is None and request.headers.get("Sec-Fetch-Site", "").lower() in FOREIGN_FETCH_SITES:
            return "a request another site's page made (Sec-Fetch-Site) may not use this node's API"
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        why = self.refusal(request)
        if why is not None:
            if request.path == HEALTH and request.method == "GET":
                request[STRANGER] = True
                return await handler(request)
            return error_response(403, why, "permission_error", code="forbidden_origin", path=request.path)
        origin = request.headers.get("Origin")
        if origin is not None:
            request[ALLOWED_ORIGIN] = origin
            if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
                return self._preflight(request, origin)
        return await handler(request)

    def _preflight(self, request: web.Request, origin: str) -> web.Response:
        asked = [h.strip().lower() for h in request.headers.get("Access-Control-Request-Headers", "").split(",")
                 if h.strip()]
        headers = list(CLIENT_HEADERS[:-1]) + [h for h in asked if _client_header(h)]
        response = web.Response(status=204, headers={
            "Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": METHODS,
            "Access-Control-Allow-Headers": ", ".join(dict.fromkeys(headers)),
            "Access-Control-Allow-Credentials": "true", "Access-Control-Max-Age": PREFLIGHT_MAX_AGE_S,
            "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"})
        return response


def _client_header(name: str) -> bool:
    return name in CLIENT_HEADERS or name.startswith("x-stainless-")


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """app.on_response_prepare: an allowed page may read the answer, streamed ones too (before their
    first byte)."""
    origin = request.get(ALLOWED_ORIGIN)
    if origin is not None and "Access-Control-Allow-Origin" not in response.headers:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Allow-Credentials"] = "true"
        response.headers["Access-Control-Expose-Headers"] = EXPOSED
        response.headers.add("Vary", "Origin")
