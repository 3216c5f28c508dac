"""POST /v1/chat/completions and /v1/completions, streaming or not."""

from __future__ import annotations

import time
import uuid
from contextlib import aclosing

from aiohttp import web

from ..entry.pipeline import NoPipeline
from ..entry.service import Finished, InferenceService, PromptTooLong, TextDelta
from .admission import Admission
from .errors import ApiError
from .request_parsing import CompletionParams, parse_messages, parse_params, parse_prompt, read_json_object
from .sse import open_event_stream, send_event


class CompletionRoutes:
    def __init__(self, service: InferenceService, model_id: str, admission: Admission):
        self.service, self.model_id, self.admission = service, model_id, admission

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await read_json_object(request)
        messages = parse_messages(body)
        params = self._params(body)
        prompt = _encoded(self.service.encode_chat, messages)
        return await self._respond(request, prompt, params, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json_object(request)
        text = parse_prompt(body)
        params = self._params(body)
        return await self._respond(request, _encoded(self.service.encode_text, text), params, chat=False)

    def _params(self, body: dict) -> CompletionParams:
        params = parse_params(body, self.service.context_length, self.service.vocab_size)
        if params.model is not None and params.model != self.model_id:
            raise ApiError(404, f"model {params.model!r} is not served here; this swarm serves "
                                f"{self.model_id!r}", param="model", code="model_not_found")
        return params

    async def _respond(self, request, prompt: list[int], params: CompletionParams,
                       chat: bool) -> web.StreamResponse:
        service = self.service
        try:
            max_tokens = service.budget(len(prompt), params.max_tokens)
        except ValueError as e:
            raise ApiError(400, str(e), param="max_tokens", code="context_length_exceeded")
        async with self.admission.slot():  # waits its turn, or 429 (admission.py)
            return await self._generate(request, prompt, params, max_tokens, chat)

    async def _generate(self, request, prompt: list[int], params: CompletionParams, max_tokens: int,
                        chat: bool) -> web.StreamResponse:
        events = self.service.complete(prompt, params.sampling, max_tokens, params.stop)
        shape = _ChatShape(self.model_id) if chat else _TextShape(self.model_id)
        async with aclosing(events):
            # The first event decides the HTTP status: no pipeline in time is a 503,
            # which a client can only see before the stream has started.
            try:
                first = await anext(events)
            except NoPipeline as e:
                raise ApiError(503, str(e), "service_unavailable", code="no_pipeline")
            if params.stream:
                return await _stream(request, first, events, shape, params.include_usage)
            return await _collect(first, events, shape)


def _encoded(encode, prompt) -> list[int]:
    try:
        return encode(prompt)
    except PromptTooLong as e:
        raise ApiError(400, str(e), param="messages" if isinstance(prompt, list) else "prompt",
                       code="context_length_exceeded")


async def _collect(first, events, shape) -> web.Response:
    parts, done = [], None
    try:
        async for ev in _chain(first, events):
            if isinstance(ev, TextDelta):
                parts.append(ev.text)
            else:
                done = ev
    except NoPipeline as e:
        raise ApiError(503, str(e), "service_unavailable", code="no_pipeline")
    return web.json_response(shape.whole("".join(parts), done))


async def _stream(request, first, events, shape, include_usage: bool) -> web.StreamResponse:
    resp = await open_event_stream(request)
    # A client that goes away makes a write raise; leaving the loop closes the event
    # generator (aclosing above), whose cleanup frees the request's KV caches on every stage.
    if opening := shape.opening():
        await send_event(resp, opening)
    try:
        async for ev in _chain(first, events):
            if isinstance(ev, TextDelta):
                await send_event(resp, shape.delta(ev.text))
            else:
                await send_event(resp, shape.final(ev))
                if include_usage:
                    await send_event(resp, shape.usage_chunk(ev))
    except NoPipeline as e:  # the swarm lost capacity mid-stream and did not get it back in time
        await send_event(resp, {"error": {"message": str(e), "type": "service_unavailable",
                                          "param": None, "code": "no_pipeline"}})
    except ConnectionError:  # the client went away; leaving frees the request's caches
        return resp
    await send_event(resp, "[DONE]")
    await resp.write_eof()
    return resp


async def _chain(first, rest):
    yield first
    async for ev in rest:
        yield ev


def _route(done: Finished) -> dict:
    return {"swarm": done.route} if done.route else {}


def _usage(done: Finished) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


class _ChatShape:
    def __init__(self, model: str):
        self.id, self.model, self.created = f"chatcmpl-{uuid.uuid4().hex}", model, int(time.time())

    def _chunk(self, choices: list) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": choices}

    def opening(self) -> dict:
        return self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])

    def delta(self, text: str, finish: str | None = None) -> dict:
        return self._chunk([{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}])

    def final(self, done: Finished) -> dict:
        return {**self.delta("", done.reason), **_route(done)}

    def usage_chunk(self, done: Finished) -> dict:
        return {**self._chunk([]), "usage": _usage(done)}

    def whole(self, text: str, done: Finished) -> dict:
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": done.reason, "logprobs": None}],
                "usage": _usage(done), **_route(done)}


class _TextShape:
    def __init__(self, model: str):
        self.id, self.model, self.created = f"cmpl-{uuid.uuid4().hex}", model, int(time.time())

    def _chunk(self, choices: list) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": choices}

    def opening(self) -> None:
        return None

    def delta(self, text: str, finish: str | None = None) -> dict:
        return self._chunk([{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}])

    def final(self, done: Finished) -> dict:
        return {**self.delta("", done.reason), **_route(done)}

    def usage_chunk(self, done: Finished) -> dict:
        return {**self._chunk([]), "usage": _usage(done)}

    def whole(self, text: str, done: Finished) -> dict:
        return {**self._chunk([{"index": 0, "text": text, "finish_reason": done.reason, "logprobs": None}]),
                "usage": _usage(done), **_route(done)}
