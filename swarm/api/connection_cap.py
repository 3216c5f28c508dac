"""At most so many HTTP connections from one address, and in all, at once (event loop).

aiohttp takes every connection it is offered; a client that opens thousands (or trickles
its headers on each) holds a file descriptor and a handler apiece until they time out.
So the runner's protocol factory is wrapped: a connection past the cap from its address
gets a plain 429, one past the total a 503, and is closed before aiohttp ever sees it; the
others are handed to aiohttp's own handler, unchanged. The total is half the descriptor
limit as it is when the connection arrives (clients on the node's own machine pass it): slow
clients from many addresses can never take the descriptors the node's peers, probes and
model files need.
"""

from __future__ import annotations

import asyncio
import resource
from collections import Counter
from typing import Any, Callable

from aiohttp import web

from .local_client import on_this_machine

DEFAULT_PER_ADDRESS = 64
MAX_TOTAL = 8192


def total_from_descriptor_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_TOTAL if soft == resource.RLIM_INFINITY else max(16, min(MAX_TOTAL, soft // 2))


def _refusal(status: bytes, kind: bytes, message: bytes) -> bytes:
    body = (b'{"error": {"message": "%s", "type": "%s", "param": null, "code": "too_many_connections"}}'
            % (message, kind))
    return (b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (status, len(body), body))


_TOO_MANY = _refusal(b"429 Too Many Requests", b"rate_limit_error", b"too many connections from your address")
_FULL = _refusal(b"503 Service Unavailable", b"service_unavailable",
                 b"this node holds all the connections it can; try again shortly")


class PerAddressCap:
    """aiohttp's server (the protocol factory), admitting at most `limit` connections per address."""

    def __init__(self, server: Any, limit: int, total: Callable[[], int] = total_from_descriptor_limit):
        self._server, self.limit, self.total = server, limit, total
        self.open: Counter[str] = Counter()
        self.held = 0
        self.refused = 0

    def __call__(self) -> asyncio.Protocol:
        return _Gate(self, self._server)

    def __getattr__(self, name: str) -> Any:  # shutdown, pre_shutdown, connections, ...: aiohttp's own
        return getattr(self._server, name)


class _Gate(asyncio.Protocol):
    def __init__(self, cap: PerAddressCap, factory: Callable[[], asyncio.BaseProtocol]):
        self._cap, self._factory = cap, factory
        self._inner: Any = None
        self._address = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self._address = peer[0] if peer else "?"
        cap = self._cap
        refusal = (_TOO_MANY if cap.open[self._address] >= cap.limit else
                   _FULL if cap.held >= cap.total() and not on_this_machine(transport) else None)
        if refusal is not None:
            cap.refused += 1
            transport.write(refusal)  # type: ignore[attr-defined]
            transport.close()
            return
        cap.open[self._address] += 1
        cap.held += 1
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is None:
            return
        self._cap.open[self._address] -= 1
        self._cap.held -= 1
        if self._cap.open[self._address] <= 0:
            del self._cap.open[self._address]
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class CappedAppRunner(web.AppRunner):
    """web.AppRunner whose connections are capped per address (`per_address`)."""

    def __init__(self, app: web.Application, *, per_address: int = DEFAULT_PER_ADDRESS, **kwargs: Any):
        super().__init__(app, **kwargs)
        self.per_address = per_address

    async def _make_server(self) -> Any:
        return PerAddressCap(await super()._make_server(), self.per_address)
