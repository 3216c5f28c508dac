"""GET /v1/topology (a snapshot) and /v1/topology/events (a live SSE stream) for dashboards."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..events import EventBus
from ..status.node_status import NodeStatus
from .sse import open_event_stream, send_event

SNAPSHOT_EVERY_S = 1.0  # while anything happens, watchers get a fresh picture at least this often


class TopologyRoutes:
    def __init__(self, status: NodeStatus, events: EventBus):
        self.status, self.bus = status, events
        self._closing = asyncio.Event()

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/v1/topology", self.snapshot)
        app.router.add_get("/v1/topology/events", self.events)
        app.on_shutdown.append(self._close_streams)

    async def _close_streams(self, _app) -> None:
        self._closing.set()  # endless event streams must not hold up the node's shutdown

    async def snapshot(self, _request: web.Request) -> web.Response:
        return web.json_response(self.status.topology())

    async def events(self, request: web.Request) -> web.StreamResponse:
        bus = self.bus
        queue = bus.subscribe()
        try:
            resp = await open_event_stream(request)
            await send_event(resp, self.status.topology(), event="snapshot")
            while not self._closing.is_set():
                try:
                    event = await asyncio.wait_for(queue.get(), SNAPSHOT_EVERY_S)
                except asyncio.TimeoutError:
                    await send_event(resp, self.status.topology(), event="snapshot")
                    continue
                await send_event(resp, event, event=event["type"])
                while not queue.empty():
                    event = queue.get_nowait()
                    await send_event(resp, event, event=event["type"])
                await send_event(resp, self.status.topology(), event="snapshot")
            return resp
        except ConnectionError:  # the watcher went away
            return resp
        finally:
            bus.unsubscribe(queue)
