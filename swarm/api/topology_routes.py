"""GET /v1/topology (a snapshot) and /v1/topology/events (a live SSE stream) for dashboards."""

from __future__ import annotations

import asyncio

from aiohttp import web

from .sse import open_event_stream, send_event

SNAPSHOT_EVERY_S = 1.0  # while anything happens, watchers get a fresh picture at least this often


class TopologyRoutes:
    def __init__(self, node):
        self.node = node
        self._closing = asyncio.Event()

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/v1/topology", self.snapshot)
        app.router.add_get("/v1/topology/events", self.events)
        app.on_shutdown.append(self._close_streams)

    async def _close_streams(self, _app) -> None:
        self._closing.set()  # endless event streams must not hold up the node's shutdown

    async def snapshot(self, _request: web.Request) -> web.Response:
        if self.node.service is None:
            return web.json_response({"can_serve": False, "status": "starting", "nodes": [], "plan": None},
                                     status=503)
        return web.json_response(self.node.topology())

    async def events(self, request: web.Request) -> web.StreamResponse:
        if self.node.service is None:
            return await self.snapshot(request)
        bus = self.node.events
        queue = bus.subscribe()
        try:
            resp = await open_event_stream(request)
            await send_event(resp, self.node.topology(), event="snapshot")
            while not self._closing.is_set():
                try:
                    event = await asyncio.wait_for(queue.get(), SNAPSHOT_EVERY_S)
                except asyncio.TimeoutError:
                    await send_event(resp, self.node.topology(), event="snapshot")
                    continue
                await send_event(resp, event, event=event["type"])
                while not queue.empty():
                    event = queue.get_nowait()
                    await send_event(resp, event, event=event["type"])
                await send_event(resp, self.node.topology(), event="snapshot")
            return resp
        except ConnectionError:  # the watcher went away
            return resp
        finally:

            bus.unsubscribe(queue)
