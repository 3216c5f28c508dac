"""The API's door: counts the requests being answered, and once closed (Ctrl-C) refuses new ones.

Runs on the event loop. Only generation (POST under /v1/, and Ollama's under /api/) passes through it: /health and
/v1/topology keep answering while the node finishes what it took.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from .errors import OLLAMA_PREFIX, ApiError


class RequestGate:
    def __init__(self) -> None:
        self.active = 0
        self.closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        if request.method != "POST" or not request.path.startswith(("/v1/", OLLAMA_PREFIX)):
            return await handler(request)
        if self.closed:
            raise ApiError(503, "this node is shutting down and takes no new requests; send them to another node "
                                "of the swarm", "service_unavailable", code="shutting_down")
        self.active += 1
        self._idle.clear()
        try:
            return await handler(request)
        finally:
            self.active -= 1
            if not self.active:
                self._idle.set()

    def close(self) -> int:
        """Take no new requests; how many are still being answered."""
        self.closed = True
        return self.active

    async def wait_idle(self) -> None:
        await self._idle.wait()
