"""Which request fields this server honours, which it accepts without effect, and which it refuses.

A field is accepted only if the answer is what the client asked for: either it is
applied, or ignoring it cannot change what comes back (an end-user id, a caching
hint, "store this", a service tier, a reasoning effort asked of a model that does not
reason). Those no-effect fields are named in the log and in the `x-swarm-ignored`
response header, so a client can see what it sent for nothing. Anything else, including
fields an API adds later, is refused by name rather than silently dropped. A field sent
as null counts as left out. Every API face (chat completions, Anthropic Messages,
Responses, ...) checks its body here, with its own set of field names.
"""

from __future__ import annotations

import logging
from typing import Callable

from aiohttp import web

from .errors import ApiError

log = logging.getLogger(__name__)
IGNORED_HEADER = "x-swarm-ignored"
_IGNORED = "swarm_ignored"  # the request's list of fields accepted without effect

# Applied. (top_k and repetition_penalty are vLLM's extensions, as mlx-lm's server takes them.)
_SAMPLING = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options",
             "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs",
             "speculate"}  # (ours: false keeps draft tokens out of its decode steps)
CHAT_FIELDS = _SAMPLING | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                           "parallel_tool_calls", "response_format",
                           # no effect on the answer (see NO_EFFECT)
                           "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
                           "metadata", "store", "service_tier", "reasoning_effort", "verbosity"}
# return_token_ids: vLLM's extension, each choice's generated token ids beside its text.
COMPLETION_FIELDS = _SAMPLING | {"prompt", "echo", "best_of", "suffix", "user", "return_token_ids"}


def must_be_string(name: str, value) -> str | None:
    return None if isinstance(value, str) else f"'{name}' must be a string"


def must_be_boolean(name: str, value) -> str | None:
    return None if isinstance(value, bool) else f"'{name}' must be a boolean"


def must_be_string_map(name: str, value) -> str | None:
    ok = isinstance(value, dict) and all(isinstance(v, (str, type(None))) for v in value.values())
    return None if ok else f"'{name}' must be an object of string values"


def must_be_object(name: str, value) -> str | None:
    return None if isinstance(value, dict) else f"'{name}' must be an object"


def must_be_one_of(*values: str) -> Callable[[str, object], str | None]:
    def check(name: str, value) -> str | None:
        return None if value in values else f"'{name}' must be one of {list(values)}, got {value!r}"
    return check


def optional_field(body: dict, name: str, check: Callable[[str, object], str | None]):
    """body[name], None when left out (or null); a 400 naming it when `check` refuses its value."""
    value = body.get(name)
    if value is not None and (problem := check(name, value)) is not None:
        raise ApiError(400, problem, param=name)
    return value


# Accepted and changing nothing here, each with the check its value must pass (None: it does).
# Service tiers, regions and speeds are about cost and latency; the reasoning efforts ask a model
# that does not reason for nothing (a model that does refuses them: reasoning=True in check_fields).
NO_EFFECT: dict[str, Callable[[str, object], str | None]] = {
    "user": must_be_string, "safety_identifier": must_be_string, "prompt_cache_key": must_be_string,
    "prompt_cache_retention": must_be_string, "metadata": must_be_string_map, "store": must_be_boolean,
    "service_tier": must_be_one_of("auto", "default", "flex", "scale", "priority", "standard_only"),
    "reasoning_effort": must_be_one_of("none", "minimal", "low", "medium", "high", "xhigh"),
    "verbosity": must_be_one_of("low", "medium", "high"),
    # Anthropic's
    "cache_control": must_be_object, "inference_geo": must_be_string, "speed": must_be_one_of("standard", "fast"),
}
REASONING_FIELDS = frozenset({"reasoning_effort", "verbosity"})

# Accepted with these values only: anything else would ask for something this server does not do.
_ONLY = {"suffix": ({""}, "'suffix' (insertion) is not supported")}

_WHY_NOT = {
    "functions": "'functions' is deprecated and not supported; use 'tools'",
    "function_call": "'function_call' is deprecated and not supported; use 'tool_choice'",
    "audio": "audio output is not supported", "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
}


def check_fields(body: dict, allowed: set[str], reasoning: bool = False,
                 no_effect: dict[str, Callable[[str, object], str | None]] | None = None,
                 why_not: dict[str, str] | None = None, only: dict[str, tuple[set, str]] | None = None,
                 applied: frozenset[str] = frozenset()) -> list[str]:
    """The fields of `body` accepted without effect (for report_ignored); a 400 naming the first
    field this server would not honour. `reasoning`: the model reasons, so a reasoning effort
    would change its answer (and cannot be honoured). A face adds its own: `no_effect`, fields
    without effect with their checks, besides NO_EFFECT (they must be in `allowed` too); `why_not`,
    why a field is refused; `only`, fields accepted at these values only, and why not at others;
    `applied`, fields NO_EFFECT lists that this face does apply."""
    checks = {name: check for name, check in {**NO_EFFECT, **(no_effect or {})}.items() if name not in applied}
    reasons, limits = {**_WHY_NOT, **(why_not or {})}, {**_ONLY, **(only or {})}
    ignored = []
    for name, value in body.items():
        if value is None:
            continue
        if name not in allowed:
            if name == "modalities" and value == ["text"]:
                continue
            raise ApiError(400, reasons.get(name, f"unsupported field {name!r}: this server does not "
                                                  f"implement it (it is refused rather than ignored)"),
                           param=name, code="unsupported_parameter")
        if name in limits and not any(type(value) is type(v) and value == v for v in limits[name][0]):
            raise ApiError(400, limits[name][1], param=name, code="unsupported_parameter")
        if name in checks:
            if reasoning and name in REASONING_FIELDS:
                raise ApiError(400, f"'{name}' cannot be honoured: this model reasons, and how much is not "
                                    f"something this server controls", param=name, code="unsupported_parameter")
            if (problem := checks[name](name, value)) is not None:
                raise ApiError(400, problem, param=name)
            if value not in ([], {}):  # an empty list or object asks for nothing at all
                ignored.append(name)
    return ignored


def report_ignored(request: web.Request, names: list[str]) -> None:
    """Fields accepted that change nothing here: named in the log and in the x-swarm-ignored header."""
    if names:
        request[_IGNORED] = list(dict.fromkeys(request.get(_IGNORED, []) + list(names)))
        log.info("%s %s: accepted and ignored (nothing here changes with them): %s", request.method, request.path,
                 ", ".join(names))


async def ignored_header(request: web.Request, response: web.StreamResponse) -> None:
    """app.on_response_prepare: the header goes on streamed answers too, before their first byte."""
    if names := request.get(_IGNORED):
        response.headers[IGNORED_HEADER] = ", ".join(names)
