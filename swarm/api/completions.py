"""POST /v1/chat/completions and /v1/completions, streaming or not, with n choices."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import replace

from aiohttp import web

from ..engine.decoding_rules import MAX_GRAMMAR_CHARS, DecodingRules
from ..entry.chat_prompt import JSON_TOOLS, TemplateRejected, ToolFormat
from ..entry.grammars import (GrammarError, checked, forced_tool_calls_grammar, json_schema_grammar,
                              lazy_tool_calls_grammar, tool_call_schema)
from ..planning.errors import NoPipeline
from ..entry.service import Finished, InferenceService, PromptScores, PromptTooLong, TextDelta, TokenScore
from ..entry.tool_call_output import ToolCallOutput
from ..models.generation_defaults import GenerationDefaults
from .admission import Admission
from .errors import ApiError
from .request_fields import CHAT_FIELDS, COMPLETION_FIELDS, check_fields
from .request_parsing import CompletionParams, parse_messages, parse_params, parse_prompt, read_json_object
from .response_format import parse_response_format
from .response_shapes import ChatShape, Collected, TextShape, TokenTexts
from .sse import open_event_stream, send_event
from .tool_params import ToolRequest, parse_tools


class CompletionRoutes:
    def __init__(self, service: InferenceService, model_id: str, admission: Admission,
                 defaults: GenerationDefaults | None = None):
        self.service, self.model_id, self.admission = service, model_id, admission
        self.defaults = defaults or GenerationDefaults()
        self.texts = TokenTexts(service.vocab)

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await read_json_object(request)
        check_fields(body, CHAT_FIELDS)
        messages = parse_messages(body)
        tools = parse_tools(body)
        schema = parse_response_format(body)
        params = self._params(body, chat=True)
        if schema is not None and tools.offered:
            raise ApiError(400, "response_format together with tools is not supported; send tool_choice 'none' "
                                "or leave one out", param="response_format")
        prompt = await _encoded(self.service.encode_chat, messages, tools.offered)
        grammar, fmt = await self._chat_grammar(tools, schema)
        make_output = (lambda: ToolCallOutput(fmt, tools.tools)) if tools.offered else None
        return await self._respond(request, prompt, params, params.with_rules(grammar=grammar),
                                   ChatShape(self.model_id, self.texts), make_output)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json_object(request)
        check_fields(body, COMPLETION_FIELDS)
        text = parse_prompt(body)
        params = self._params(body, chat=False)
        prompt = await _encoded(self.service.encode_text, text)
        return await self._respond(request, prompt, params, params.rules, TextShape(self.model_id, self.texts),
                                   None, echo=text if params.echo else None)

    def _params(self, body: dict, chat: bool) -> CompletionParams:
        params = parse_params(body, self.service.context_length, self.service.vocab_size, self.defaults, chat)
        if params.model is not None and params.model != self.model_id:
            raise ApiError(404, f"model {params.model!r} is not served here; this swarm serves "
                                f"{self.model_id!r}", param="model", code="model_not_found")
        return params

    async def _chat_grammar(self, tools: ToolRequest, schema: dict | None) -> tuple[str | None, ToolFormat]:
        """The grammar the answer follows, and the form its tool calls are parsed in (built and checked on
        the prompt threads: a schema's grammar, and the first one's view of the vocabulary, take a while)."""
        return await self.service.off_loop(self._chat_grammar_now, tools, schema)

    def _chat_grammar_now(self, tools: ToolRequest, schema: dict | None) -> tuple[str | None, ToolFormat]:
        vocab, fmt = self.service.vocab, self.service.chat_prompt.tool_format
        calls = [tool_call_schema(f["name"], f["parameters"]) for f in tools.forced or
                 [t["function"] for t in tools.offered or []]]
        if tools.forced:  # "required" or a named function: nothing but calls, in the json_tools form
            grammar, param, fmt = forced_tool_calls_grammar(calls, vocab, tools.choice == "required"
                                                            and tools.parallel), "tools", JSON_TOOLS
        elif tools.offered and fmt.is_json_tools:  # "auto": free text, but a call once opened is a valid one
            grammar, param = lazy_tool_calls_grammar(calls, vocab, tools.parallel), "tools"
        elif schema is not None:
            try:
                grammar, param = json_schema_grammar(schema), "response_format"
            except ValueError as e:
                raise ApiError(400, f"response_format schema: {e}", param="response_format")
        else:
            return None, fmt
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise ApiError(400, f"the {param} schema is too large ({len(grammar)} characters as a grammar, "
                                f"at most {MAX_GRAMMAR_CHARS})", param=param)
        try:
            return checked(grammar, vocab), fmt
        except GrammarError as e:
            raise ApiError(400, f"the {param} schema cannot be followed: {e}", param=param)

    async def _respond(self, request, prompt: list[int], params: CompletionParams, rules: DecodingRules | None,
                       shape, make_output, echo: str | None = None) -> web.StreamResponse:
        service = self.service
        try:
            max_tokens = service.budget(len(prompt), params.max_tokens)
        except ValueError as e:
            raise ApiError(400, str(e), param="max_tokens", code="context_length_exceeded")
        async with self.admission.slot():  # waits its turn, or 429 (admission.py)
            return await self._generate(request, prompt, params, rules, shape, make_output, echo, max_tokens)

    async def _generate(self, request, prompt: list[int], params: CompletionParams, rules: DecodingRules | None,
                        shape, make_output, echo: str | None, max_tokens: int) -> web.StreamResponse:
        service = self.service
        if rules is not None and rules.logprobs is not None:
            await asyncio.to_thread(lambda: service.vocab.ll)  # token texts for logprobs (built once)
        seed = params.sampling.seed
        streams = [service.complete(prompt, replace(params.sampling, seed=(seed + i) % 2**64), max_tokens,
                                    params.stop, rules, make_output() if make_output else None)
                   for i in range(params.n)]
        run = _Run(prompt, rules, echo, streams)
        try:
            # The first events decide the HTTP status: no pipeline in time is a 503,
            # which a client can only see before the stream has started.
            firsts = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
            for first in firsts:
                if isinstance(first, NoPipeline):
                    raise ApiError(503, str(first), "service_unavailable", code="no_pipeline")
                if isinstance(first, BaseException):
                    raise first
            if params.stream:
                return await _stream(request, run, firsts, shape, params.include_usage)
            return await _collect(run, firsts, shape)
        finally:
            for s in streams:
                await s.aclose()  # frees the request's caches on every stage, whatever happened


class _Run:
    """What every choice of one request shares."""

    def __init__(self, prompt: list[int], rules: DecodingRules | None, echo: str | None, streams: list):
        self.prompt, self.echo, self.streams = prompt, echo, streams
        self.wants_logprobs = rules is not None and rules.logprobs is not None
        self.echo_scored = rules is not None and rules.echo_logprobs

    def prompt_scores(self, ev: PromptScores) -> list[TokenScore]:
        """Echo: every prompt token, the first without a logprob (nothing comes before it)."""
        return [TokenScore(self.prompt[0], 0.0), *ev.scores]


async def _encoded(encode, *args) -> list[int]:
    try:
        return await encode(*args)
    except PromptTooLong as e:
        raise ApiError(400, str(e), param="messages" if isinstance(args[0], list) else "prompt",
                       code="context_length_exceeded")
    except TemplateRejected as e:
        raise ApiError(400, str(e), param="messages")


async def _events(first, stream):
    yield first
    async for ev in stream:
        yield ev


async def _collect(run: _Run, firsts: list, shape) -> web.Response:
    choices = [Collected(run.wants_logprobs) for _ in firsts]

    async def gather(c: Collected, first, stream) -> None:
        if run.echo is not None:
            c.text = run.echo
        async for ev in _events(first, stream):
            if isinstance(ev, TextDelta):
                c.text += ev.text
                c.tool_calls += ev.tool_calls
                c.scores += ev.logprobs
            elif isinstance(ev, PromptScores):
                c.scores = run.prompt_scores(ev) + c.scores
                c.first_unscored = True
            else:
                c.done = ev

    results = await asyncio.gather(*(gather(c, f, s) for c, f, s in zip(choices, firsts, run.streams)),
                                   return_exceptions=True)
    for r in results:
        if isinstance(r, NoPipeline):
            raise ApiError(503, str(r), "service_unavailable", code="no_pipeline")
        if isinstance(r, BaseException):
            raise r
    return web.json_response(shape.whole(choices, len(run.prompt)))


async def _stream(request, run: _Run, firsts: list, shape, include_usage: bool) -> web.StreamResponse:
    resp = await open_event_stream(request)
    n = len(firsts)
    finished: list[Finished | None] = [None] * n
    offsets = [0] * n  # legacy logprobs' text_offset runs on across chunks
    # A client that goes away makes a write raise; leaving the loop closes the event
    # generators (the route's finally), whose cleanup frees the request's KV caches on every stage.
    try:
        if opening := shape.opening(n):
            await send_event(resp, opening)
        async with aclosing(_merged(firsts, run.streams)) as events:
            await _send_all(resp, run, events, shape, finished, offsets)
        if include_usage:
            await send_event(resp, shape.usage_chunk(len(run.prompt), finished))
    except NoPipeline as e:  # the swarm lost capacity mid-stream and did not get it back in time
        await send_event(resp, {"error": {"message": str(e), "type": "service_unavailable",
                                          "param": None, "code": "no_pipeline"}})
    except ConnectionError:  # the client went away; leaving frees the request's caches
        return resp
    await send_event(resp, "[DONE]")
    await resp.write_eof()
    return resp


async def _send_all(resp, run: _Run, events, shape, finished: list, offsets: list) -> None:
    for_logprobs = run.wants_logprobs
    async for i, ev in events:
        if run.echo is not None and offsets[i] == 0 and not isinstance(ev, PromptScores):
            await send_event(resp, shape.delta(i, run.echo, [], [] if for_logprobs else None))  # echo, unscored
            offsets[i] = len(run.echo)
        if isinstance(ev, TextDelta):
            await send_event(resp, shape.delta(i, ev.text, ev.tool_calls, ev.logprobs if for_logprobs else None,
                                               offset=offsets[i]))
            offsets[i] += len(ev.text)
        elif isinstance(ev, PromptScores):  # echo with logprobs: the prompt goes out with its scores
            await send_event(resp, shape.delta(i, run.echo, [], run.prompt_scores(ev), first_unscored=True))
            offsets[i] = len(run.echo)
        else:
            finished[i] = ev
            await send_event(resp, shape.final(i, ev))


async def _merged(firsts: list, streams: list):
    """(choice index, event) from every choice as they come; one choice is read directly."""
    if len(streams) == 1:
        async for ev in _events(firsts[0], streams[0]):
            yield 0, ev
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int) -> None:
        try:
            async for ev in _events(firsts[i], streams[i]):
                await queue.put((i, ev))
        except Exception as e:
            await queue.put((i, e))
        await queue.put((i, done))

    tasks = [asyncio.create_task(pump(i)) for i in range(len(streams))]
    try:
        running = len(tasks)
        while running:
            i, ev = await queue.get()
            if ev is done:
                running -= 1
            elif isinstance(ev, Exception):
                raise ev
            else:
                yield i, ev
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
