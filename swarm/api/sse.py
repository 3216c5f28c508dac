"""Server-sent events for streaming responses."""

from __future__ import annotations

import json

from aiohttp import web


async def open_event_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    return resp


async def send_event(resp: web.StreamResponse, data: dict | str, event: str | None = None) -> None:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    await resp.write(f"{head}data: {payload}\n\n".encode())
