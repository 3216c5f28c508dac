"""POST /v1/chat/completions and /v1/completions, streaming or not, with n choices."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from aiohttp import web

from ..engine.decoding_rules import DecodingRules
from ..planning.errors import NoPipeline
from ..entry.service import Finished, PromptScores, TextDelta, TokenScore
from .errors import ApiError
from .generation import Generation, chained, no_pipeline_error
from .request_fields import CHAT_FIELDS, COMPLETION_FIELDS, check_fields, report_ignored
from .request_parsing import CompletionParams, parse_messages, parse_prompt, read_json_object
from .response_format import parse_response_format
from .response_shapes import ChatShape, Collected, TextShape, TokenTexts
from .sse import open_event_stream, send_event
from .tool_params import parse_tools


class CompletionRoutes:
    def __init__(self, generation: Generation):
        self.generation = generation
        self.service, self.model_id = generation.service, generation.model_id
        self.texts = TokenTexts(self.service.vocab)

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await read_json_object(request)
        report_ignored(request, check_fields(body, CHAT_FIELDS, reasoning=self.service.chat_prompt.reasons))
        messages = parse_messages(body)
        tools = parse_tools(body)
        schema = parse_response_format(body)
        params = self._params(body, chat=True)
        if schema is not None and tools.offered:
            raise ApiError(400, "response_format together with tools is not supported; send tool_choice 'none' "
                                "or leave one out", param="response_format")
        gen = self.generation
        prompt = await gen.encode_chat(messages, tools.offered)
        grammar, fmt = await gen.chat_grammar(tools, schema)
        return await self._respond(request, prompt, params, params.with_rules(grammar=grammar),
                                   ChatShape(self.model_id, self.texts), gen.tool_output(tools, fmt))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json_object(request)
        report_ignored(request, check_fields(body, COMPLETION_FIELDS))
        text = parse_prompt(body)
        params = self._params(body, chat=False)
        prompt = await self.generation.encode_text(text)
        return await self._respond(request, prompt, params, params.rules, TextShape(self.model_id, self.texts),
                                   None, echo=text if params.echo else None)

    def _params(self, body: dict, chat: bool) -> CompletionParams:
        params = self.generation.params(body, chat)
        self.generation.check_model(params.model)
        return params

    async def _respond(self, request, prompt: list[int], params: CompletionParams, rules: DecodingRules | None,
                       shape, make_output, echo: str | None = None) -> web.StreamResponse:
        async with self.generation.started(prompt, params, rules, make_output) as started:
            run = _Run(prompt, rules, echo, started.streams)
            if params.stream:
                return await _stream(request, run, started.firsts, shape, params.include_usage)
            return await _collect(run, started.firsts, shape)


class _Run:
    """What every choice of one request shares."""

    def __init__(self, prompt: list[int], rules: DecodingRules | None, echo: str | None, streams: list):
        self.prompt, self.echo, self.streams = prompt, echo, streams
        self.wants_logprobs = rules is not None and rules.logprobs is not None
        self.echo_scored = rules is not None and rules.echo_logprobs

    def prompt_scores(self, ev: PromptScores) -> list[TokenScore]:
        """Echo: every prompt token, the first without a logprob (nothing comes before it)."""
        return [TokenScore(self.prompt[0], 0.0), *ev.scores]


async def _collect(run: _Run, firsts: list, shape) -> web.Response:
    choices = [Collected(run.wants_logprobs) for _ in firsts]

    async def gather(c: Collected, first, stream) -> None:
        if run.echo is not None:
            c.text = run.echo
        async for ev in chained(first, stream):
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
            raise no_pipeline_error(r)
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
        async for ev in chained(firsts[0], streams[0]):
            yield 0, ev
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int) -> None:
        try:
            async for ev in chained(firsts[i], streams[i]):
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
