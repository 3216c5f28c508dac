"""Which request fields this server honours; every other field is a 400 naming it.

A field is accepted only if the answer is what the client asked for: either it is
applied, or ignoring it cannot change what comes back (an end-user id, a caching
hint, "do not store"). Anything else, including fields OpenAI adds later, is refused
by name rather than silently dropped. A field sent as null counts as left out.
"""

from __future__ import annotations

import logging

from aiohttp import web

from .errors import ApiError

log = logging.getLogger(__name__)
IGNORED_HEADER = "x-swarm-ignored"
_IGNORED = "swarm_ignored"  # the request's list of fields accepted without effect

# Applied. (top_k and repetition_penalty are vLLM's extensions, as mlx-lm's server takes them.)
_SAMPLING = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options",
             "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs"}
CHAT_FIELDS = _SAMPLING | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                           "parallel_tool_calls", "response_format",
                           # no effect on the answer (see _NO_EFFECT)
                           "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
                           "metadata", "store", "service_tier"}
COMPLETION_FIELDS = _SAMPLING | {"prompt", "echo", "best_of", "suffix", "user"}

# Accepted with these values only: anything else would ask for something this server does not do.
_ONLY = {
    "store": ({False}, "this server stores nothing; 'store' may only be false"),
    "service_tier": ({"auto", "default"}, "this server has one service tier: 'service_tier' may be 'auto' or "
                                          "'default'"),
    "suffix": ({""}, "'suffix' (insertion) is not supported"),
}

_WHY_NOT = {
    "functions": "'functions' is deprecated and not supported; use 'tools'",
    "function_call": "'function_call' is deprecated and not supported; use 'tool_choice'",
    "audio": "audio output is not supported", "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "'reasoning_effort' is not supported by this server",
    "verbosity": "'verbosity' is not supported by this server",
    "web_search_options": "web search is not supported",
}


def check_fields(body: dict, allowed: set[str]) -> None:
    """400 naming the first field this server would not honour."""
    for name, value in body.items():
        if value is None:
            continue
        if name not in allowed:
            if name == "modalities" and value == ["text"]:
                continue
            raise ApiError(400, _WHY_NOT.get(name, f"unsupported field {name!r}: this server does not "
                                                   f"implement it (it is refused rather than ignored)"),
                           param=name, code="unsupported_parameter")
        if name in _ONLY and not any(type(value) is type(v) and value == v for v in _ONLY[name][0]):
            raise ApiError(400, _ONLY[name][1], param=name, code="unsupported_parameter")
    for name in ("user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise ApiError(400, f"'{name}' must be a string", param=name)
    if body.get("metadata") is not None and not (
            isinstance(body["metadata"], dict) and all(isinstance(v, str) for v in body["metadata"].values())):
        raise ApiError(400, "'metadata' must be an object of string values", param="metadata")


def report_ignored(request: web.Request, names: list[str]) -> None:
    """Fields accepted that change nothing here: named in the log and in the x-swarm-ignored header."""
    if names:
        request[_IGNORED] = list(names)
        log.info("%s %s: accepted and ignored (nothing here changes with them): %s", request.method, request.path,
                 ", ".join(names))


async def ignored_header(request: web.Request, response: web.StreamResponse) -> None:
    """app.on_response_prepare: the header goes on streamed answers too, before their first byte."""
    if names := request.get(_IGNORED):
        response.headers[IGNORED_HEADER] = ", ".join(names)
