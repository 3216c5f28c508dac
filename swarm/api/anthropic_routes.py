"""POST /v1/messages (streaming or not) and /v1/messages/count_tokens: Anthropic's Messages API.

A thin face over the one generation path (generation.py): the body is checked and turned
into chat messages and tools (anthropic_request.py), and the events of the one completion
are written as Anthropic's message or stream events (anthropic_shapes.py). Errors take
Anthropic's shape from the route (errors.py); the API key may come as `x-api-key` (auth.py).
"""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from ..entry.service import Finished, TextDelta
from ..planning.errors import NoPipeline
from .anthropic_request import MessagesRequest, parse_messages_request
from .anthropic_shapes import ContentBlocks, MessageShape
from .errors import anthropic_error_type
from .generation import Generation
from .request_fields import report_ignored
from .request_parsing import read_json_object
from .sse import open_event_stream, send_event


class AnthropicRoutes:
    def __init__(self, generation: Generation):
        self.generation = generation

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        gen = self.generation
        ask = await self._parsed(request, count_only=False)
        prompt = await gen.encode_chat(ask.messages, ask.tools.offered)
        shape = MessageShape(gen.model_id)
        if ask.max_tokens == 0:  # a request to warm a cache: checked, answered, nothing generated
            return await _answer(request, ask.stream, _finished(Finished("length", len(prompt), 0)), shape,
                                 len(prompt))
        params = gen.params({"max_tokens": ask.max_tokens, **ask.sampling}, chat=True)  # defaults, seed
        params = replace(params, stop=ask.stop, stream=ask.stream)
        grammar, fmt = await gen.chat_grammar(ask.tools, ask.schema, schema_param="output_config")
        async with gen.started(prompt, params, params.with_rules(grammar=grammar),
                               gen.tool_output(ask.tools, fmt)) as started:
            return await _answer(request, ask.stream, started.events(0), shape, len(prompt))

    async def count_tokens(self, request: web.Request) -> web.Response:
        ask = await self._parsed(request, count_only=True)
        prompt = await self.generation.encode_chat(ask.messages, ask.tools.offered)
        return web.json_response({"input_tokens": len(prompt)})

    async def _parsed(self, request: web.Request, count_only: bool) -> MessagesRequest:
        gen = self.generation
        ask = parse_messages_request(await read_json_object(request), gen.service.chat_prompt.reasons, count_only)
        report_ignored(request, ask.ignored)
        gen.check_model(ask.model)
        return ask


async def _answer(request, stream: bool, events, shape: MessageShape, prompt_tokens: int) -> web.StreamResponse:
    if stream:
        return await _stream(request, events, shape, prompt_tokens)
    return await _whole(events, shape)


async def _finished(done: Finished):
    yield done


async def _whole(events, shape: MessageShape) -> web.Response:
    blocks, done = ContentBlocks(), None
    async for ev in events:
        if isinstance(ev, TextDelta):
            blocks.add(ev)
        elif isinstance(ev, Finished):
            done = ev
    return web.json_response(shape.whole(blocks.blocks, done))


async def _stream(request, events, shape: MessageShape, prompt_tokens: int) -> web.StreamResponse:
    resp = await open_event_stream(request)
    blocks = ContentBlocks()
    # A client that goes away makes a write raise; leaving closes the events (the route's `started`),
    # which frees the request's caches on every stage.
    try:
        await _send(resp, [shape.start(prompt_tokens), ("ping", {"type": "ping"})])
        async for ev in events:
            if isinstance(ev, TextDelta):
                await _send(resp, blocks.add(ev))
            elif isinstance(ev, Finished):
                await _send(resp, blocks.finish() + shape.end(ev))
    except NoPipeline as e:  # the swarm lost capacity mid-stream and did not get it back in time
        await send_event(resp, {"type": "error", "error": {"type": anthropic_error_type(503), "message": str(e)}},
                         event="error")
    except ConnectionError:
        return resp
    await resp.write_eof()
    return resp


async def _send(resp: web.StreamResponse, events: list) -> None:
    for name, data in events:
        await send_event(resp, data, event=name)
