"""Ollama's API: /api/chat and /api/generate (NDJSON streams unless "stream": false), /api/tags,
/api/show, /api/ps and /api/version, for Ollama's clients (the `ollama` package, Open WebUI, editors).

Thin over the shared generation (generation.py): a body becomes chat messages, tools, a
schema and sampling (ollama_body.py) and runs as that chat request would; its text events
go out as Ollama's chunks. Errors are `{"error": "..."}` (errors.py, by route).
"""

from __future__ import annotations

import json
import time
from contextlib import aclosing
from dataclasses import replace

from aiohttp import web

from ..planning.errors import NoPipeline
from ..entry.service import Finished, TextDelta, TokenScore
from .errors import ApiError
from .generation import Generation
from .ollama_body import OllamaRequest, parse_chat_body, parse_generate_body
from .ollama_models import OLLAMA_VERSION, OllamaModel, now_iso
from .request_fields import report_ignored
from .request_parsing import read_json_object
from .response_shapes import TokenTexts


class OllamaRoutes:
    def __init__(self, generation: Generation, model: OllamaModel):
        self.generation, self.model = generation, model
        self.texts = TokenTexts(generation.service.vocab)

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/api/chat", self.chat)
        app.router.add_post("/api/generate", self.generate)
        app.router.add_get("/api/tags", self.tags)
        app.router.add_post("/api/show", self.show)
        app.router.add_get("/api/ps", self.ps)
        app.router.add_get("/api/version", self.version)

    async def tags(self, _request: web.Request) -> web.Response:
        return web.json_response({"models": [self.model.listed()]})

    async def ps(self, _request: web.Request) -> web.Response:
        return web.json_response({"models": [self.model.running(self.generation.service.context_length)]})

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": OLLAMA_VERSION})

    async def show(self, request: web.Request) -> web.Response:
        body = await read_json_object(request)
        name = body.get("model", body.get("name"))  # older clients send "name"
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model' is required", param="model")
        self.model.check(name)
        return web.json_response(self.model.shown(self.generation.service.context_length, self._parameters()))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, parse_chat_body, chat=True)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, parse_generate_body, chat=False)

    async def _answer(self, request: web.Request, parse, chat: bool) -> web.StreamResponse:
        t0 = time.monotonic_ns()
        gen = self.generation
        body = await read_json_object(request)
        req: OllamaRequest = parse(body, lambda fields: gen.params(fields, chat=True))
        self.model.check(req.model)
        report_ignored(request, req.ignored)
        chunks = _Chunks(req.model, chat, self.texts if req.params.rules and req.params.rules.logprobs is not None
                         else None)
        if req.loads_only:  # Ollama's "load the model" call: it is loaded
            return web.json_response(chunks.loaded())
        if req.messages is not None:
            prompt = await gen.encode_chat(req.messages, req.tools.offered)
        else:
            prompt = await gen.encode_text(req.raw_prompt)
        params = req.params
        if req.until_full:
            params = replace(params, max_tokens=max(1, gen.service.context_length - len(prompt)))
        grammar, fmt = await gen.chat_grammar(req.tools, req.schema, schema_param="format")
        async with gen.started(prompt, params, params.with_rules(grammar=grammar), gen.tool_output(req.tools, fmt),
                               max_tokens_param="options.num_predict") as started:
            events = started.events()
            if params.stream:
                return await _stream(request, chunks, events, t0)
            text, calls, scores, done, first_ns = "", [], [], None, None
            async with aclosing(events):
                async for ev in events:
                    if isinstance(ev, TextDelta):
                        first_ns = first_ns or time.monotonic_ns()
                        text, calls, scores = text + ev.text, calls + ev.tool_calls, scores + ev.logprobs
                    elif isinstance(ev, Finished):
                        done = ev
        return web.json_response(chunks.final(done, t0, first_ns, text, calls, scores))

    def _parameters(self) -> str:
        d = self.generation.defaults
        return "\n".join(f"{k:<16}{v}" for k, v in (("temperature", d.temperature), ("top_p", d.top_p),
                                                      ("top_k", d.top_k)) if v is not None)


class _Chunks:
    """Ollama's response objects: a chunk per piece of text, then the final one with counts and times."""

    def __init__(self, model: str, chat: bool, texts: TokenTexts | None = None):
        self.model, self.chat = model, chat
        self.texts = texts  # set when the request asked for logprobs

    def piece(self, text: str, calls: list[dict], scores: list[TokenScore] = ()) -> dict:
        if self.chat:
            message: dict = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [_ollama_call(c) for c in calls]
            out = {"model": self.model, "created_at": now_iso(), "message": message, "done": False}
        else:
            out = {"model": self.model, "created_at": now_iso(), "response": text, "done": False}
        if self.texts is not None and scores:
            out["logprobs"] = [self._logprob(s) for s in scores]
        return out

    def _logprob(self, s: TokenScore) -> dict:
        def entry(token: int, logprob: float) -> dict:
            text, raw = self.texts(token)
            return {"token": text, "logprob": logprob, "bytes": raw}
        return {**entry(s.token, s.logprob), "top_logprobs": [entry(t, lp) for t, lp in s.top]}

    def final(self, done: Finished, t0: int, first_ns: int | None, text: str = "", calls: list | None = None,
              scores: list[TokenScore] = ()) -> dict:
        end = time.monotonic_ns()
        first_ns = first_ns or end
        out = self.piece(text, calls or [], scores)
        out.update(done=True, done_reason="length" if done.reason == "length" else "stop",
                   total_duration=end - t0, load_duration=0, prompt_eval_count=done.prompt_tokens,
                   prompt_eval_duration=first_ns - t0, eval_count=done.completion_tokens,
                   eval_duration=end - first_ns)
        return out

    def loaded(self) -> dict:
        out = self.piece("", [])
        out.update(done=True, done_reason="load")
        return out


def _ollama_call(call: dict) -> dict:
    """OpenAI's call (arguments as a JSON string) in Ollama's form (arguments as an object)."""
    f = call["function"]
    try:
        arguments = json.loads(f["arguments"])
    except ValueError:
        arguments = {}
    return {"id": call["id"], "function": {"index": call.get("index", 0), "name": f["name"],
                                           "arguments": arguments if isinstance(arguments, dict) else {}}}


async def _stream(request: web.Request, chunks: _Chunks, events, t0: int) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    first_ns = None
    try:
        async with aclosing(events):
            async for ev in events:
                if isinstance(ev, TextDelta) and (ev.text or ev.tool_calls or ev.logprobs):
                    first_ns = first_ns or time.monotonic_ns()
                    await _line(resp, chunks.piece(ev.text, ev.tool_calls, ev.logprobs))
                elif isinstance(ev, Finished):
                    await _line(resp, chunks.final(ev, t0, first_ns))
    except NoPipeline as e:  # the swarm lost capacity mid-stream and did not get it back in time
        await _line(resp, {"error": str(e)})
    except ConnectionError:  # the client went away; leaving frees the request's caches
        return resp
    await resp.write_eof()
    return resp


async def _line(resp: web.StreamResponse, obj: dict) -> None:
    await resp.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
