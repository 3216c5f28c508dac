"""POST /v1/responses (OpenAI's Responses API), streaming or not; GET and DELETE /v1/responses/{id}.

Thin over the shared generation (generation.py): the body is parsed into chat messages,
tools, a schema and sampling (responses_body.py), run as the same chat request would
be, and its events written as Responses output items (responses_events.py). Unless
`store` is false, the answer is kept on this entry (responses_store.py) for a follow-up
with `previous_response_id`.
"""

from __future__ import annotations

from contextlib import aclosing

from aiohttp import web

from ..planning.errors import NoPipeline
from ..entry.service import Finished, TextDelta
from .generation import Generation
from .request_fields import report_ignored
from .request_parsing import read_json_object
from .responses_body import ResponsesRequest, parse_responses_body
from .responses_events import ResponseBuilder
from .response_shapes import TokenTexts
from .responses_store import ResponseStore
from .sse import open_event_stream, send_event


class ResponsesRoutes:
    def __init__(self, generation: Generation, store: ResponseStore | None = None):
        self.generation = generation
        self.store = store if store is not None else ResponseStore()
        self.texts = TokenTexts(generation.service.vocab)

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self.create)
        app.router.add_get("/v1/responses/{response_id}", self.retrieve)
        app.router.add_delete("/v1/responses/{response_id}", self.delete)

    async def retrieve(self, request: web.Request) -> web.Response:
        return web.json_response(self.store.get(request.match_info["response_id"]).response)

    async def delete(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        self.store.delete(response_id)
        return web.json_response({"id": response_id, "object": "response", "deleted": True})

    async def create(self, request: web.Request) -> web.StreamResponse:
        gen = self.generation
        body = await read_json_object(request)
        req = parse_responses_body(body, lambda chat: gen.params(chat, chat=True))
        gen.check_model(req.params.model)
        report_ignored(request, req.ignored)
        earlier = self.store.conversation(req.previous_response_id) if req.previous_response_id else []
        prompt = await gen.encode_chat(req.messages(earlier), req.tools.offered, param="input")
        grammar, fmt = await gen.chat_grammar(req.tools, req.schema, schema_param="text.format")
        rules = req.params.with_rules(grammar=grammar)
        wants_logprobs = rules is not None and rules.logprobs is not None
        builder = ResponseBuilder(gen.model_id, req.echo, self.texts if wants_logprobs else None)
        async with gen.started(prompt, req.params, rules, gen.tool_output(req.tools, fmt),
                               max_tokens_param="max_output_tokens") as started:
            events = started.events()
            if req.params.stream:
                return await self._stream(request, req, builder, events, earlier)
            async with aclosing(events):
                async for ev in events:
                    builder.add(ev)
        self._keep(req, builder, earlier)
        return web.json_response(builder.snapshot(builder.status))

    async def _stream(self, request: web.Request, req: ResponsesRequest, builder: ResponseBuilder, events,
                      earlier: list[dict]) -> web.StreamResponse:
        resp = await open_event_stream(request)
        try:
            for event in builder.opening():
                await _send(resp, event)
            async with aclosing(events):
                async for ev in events:
                    if isinstance(ev, (TextDelta, Finished)):
                        for event in builder.add(ev):
                            await _send(resp, event)
            self._keep(req, builder, earlier)
        except NoPipeline as e:  # the swarm lost capacity mid-stream and did not get it back in time
            await _send(resp, {"type": "error", "sequence_number": builder.sequence, "code": "no_pipeline",
                               "message": str(e), "param": None})
        except ConnectionError:  # the client went away; leaving frees the request's caches
            return resp
        await resp.write_eof()
        return resp

    def _keep(self, req: ResponsesRequest, builder: ResponseBuilder, earlier: list[dict]) -> None:
        if req.store:
            self.store.put(builder.snapshot(builder.status),
                           earlier + req.input_messages + builder.assistant_messages())


async def _send(resp: web.StreamResponse, event: dict) -> None:
    await send_event(resp, event, event=event["type"])
