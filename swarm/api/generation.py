"""What every API face shares: a prompt, a grammar and sampling through admission and the service.

A face (chat completions, Responses, Ollama, Anthropic) parses its own body into chat
messages, tools, a schema and CompletionParams; this module encodes the prompt, builds
the grammar for forced or offered tool calls or a JSON schema (entry/grammars.py), and
runs the request: its admission slot, its token budget, the 503 when no pipeline comes
in time, and the events of each choice (TextDelta, PromptScores, Finished). Errors are
ApiErrors; the error middleware writes them in the face's own shape (errors.py).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import AsyncIterator, Callable

from ..engine.decoding_rules import MAX_GRAMMAR_CHARS, DecodingRules
from ..entry.chat_prompt import JSON_TOOLS, TemplateRejected, ToolFormat
from ..entry.grammars import (GrammarError, checked, forced_tool_calls_grammar, json_schema_grammar,
                              lazy_tool_calls_grammar, tool_call_schema)
from ..planning.errors import NoPipeline
from ..entry.service import InferenceService, PromptTooLong
from ..entry.tool_call_output import ToolCallOutput
from ..models.generation_defaults import GenerationDefaults
from .admission import Admission
from .errors import ApiError
from .request_parsing import CompletionParams, parse_params
from .tool_params import ToolRequest


@dataclass
class Started:
    """A request under way: each choice's first event (already checked) and its stream."""

    firsts: list
    streams: list

    def events(self, i: int = 0) -> AsyncIterator:
        return chained(self.firsts[i], self.streams[i])


class Generation:
    def __init__(self, service: InferenceService, model_id: str, admission: Admission,
                 defaults: GenerationDefaults | None = None):
        self.service, self.model_id, self.admission = service, model_id, admission
        self.defaults = defaults or GenerationDefaults()

    def params(self, body: dict, chat: bool) -> CompletionParams:
        """Sampling and limits from a body in chat-completions form (a face translates its own into it)."""
        return parse_params(body, self.service.context_length, self.service.vocab_size, self.defaults, chat)

    def check_model(self, requested: str | None) -> None:
        """A 404 when the request names a model this swarm does not serve (None: the one it serves)."""
        if requested is not None and requested != self.model_id:
            raise ApiError(404, f"model {requested!r} is not served here; this swarm serves {self.model_id!r}",
                           param="model", code="model_not_found")

    async def encode_chat(self, messages: list[dict], tools: list[dict] | None, param: str = "messages") -> list[int]:
        """Off the event loop (the service's prompt threads), after its size check."""
        return await _encoded(self.service.encode_chat, param, messages, tools)

    async def encode_text(self, text: str, param: str = "prompt") -> list[int]:
        return await _encoded(self.service.encode_text, param, text)

    async def chat_grammar(self, tools: ToolRequest, schema: dict | None,
                           schema_param: str = "response_format") -> tuple[str | None, ToolFormat]:
        """The grammar the answer follows, and the form its tool calls are parsed in (built and checked on
        the prompt threads: a schema's grammar, and the first one's view of the vocabulary, take a while)."""
        return await self.service.off_loop(self._chat_grammar_now, tools, schema, schema_param)

    def _chat_grammar_now(self, tools: ToolRequest, schema: dict | None,
                          schema_param: str) -> tuple[str | None, ToolFormat]:
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
                grammar, param = json_schema_grammar(schema), schema_param
            except ValueError as e:
                raise ApiError(400, f"{schema_param} schema: {e}", param=schema_param)
        else:
            return None, fmt
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise ApiError(400, f"the {param} schema is too large ({len(grammar)} characters as a grammar, "
                                f"at most {MAX_GRAMMAR_CHARS})", param=param)
        try:
            return checked(grammar, vocab), fmt
        except GrammarError as e:
            raise ApiError(400, f"the {param} schema cannot be followed: {e}", param=param)

    @staticmethod
    def tool_output(tools: ToolRequest, fmt: ToolFormat) -> Callable[[], ToolCallOutput] | None:
        """Where each choice's tool calls are taken out of its text (None: no tools offered)."""
        return (lambda: ToolCallOutput(fmt, tools.tools)) if tools.offered else None

    @asynccontextmanager
    async def started(self, prompt: list[int], params: CompletionParams, rules: DecodingRules | None,
                      make_output: Callable[[], ToolCallOutput] | None = None,
                      max_tokens_param: str = "max_tokens") -> AsyncIterator[Started]:
        """The request admitted and its first events in; its caches are freed on every stage on leaving."""
        service = self.service
        try:
            max_tokens = service.budget(len(prompt), params.max_tokens)
        except ValueError as e:
            raise ApiError(400, str(e), param=max_tokens_param, code="context_length_exceeded")
        async with self.admission.slot():  # waits its turn, or 429 (admission.py)
            if rules is not None and rules.logprobs is not None:
                await asyncio.to_thread(lambda: service.vocab.ll)  # token texts for logprobs (built once)
            seed = params.sampling.seed
            streams = [service.complete(prompt, replace(params.sampling, seed=(seed + i) % 2**64), max_tokens,
                                        params.stop, rules, make_output() if make_output else None,
                                        params.speculate)
                       for i in range(params.n)]
            try:
                # The first events decide the HTTP status: no pipeline in time is a 503,
                # which a client can only see before the stream has started.
                firsts = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
                for first in firsts:
                    if isinstance(first, BaseException):
                        raise no_pipeline_error(first) if isinstance(first, NoPipeline) else first
                yield Started(firsts, streams)
            finally:
                for s in streams:
                    await s.aclose()  # frees the request's caches on every stage, whatever happened


def no_pipeline_error(e: NoPipeline) -> ApiError:
    return ApiError(503, str(e), "service_unavailable", code="no_pipeline")


async def _encoded(encode, param: str, *args) -> list[int]:
    try:
        return await encode(*args)
    except PromptTooLong as e:
        raise ApiError(400, str(e), param=param, code="context_length_exceeded")
    except TemplateRejected as e:
        raise ApiError(400, str(e), param=param)


async def chained(first, stream):
    """A choice's events: its first (taken to check it) and the rest."""
    yield first
    async for ev in stream:
        yield ev
