"""Validation of /v1/chat/completions and /v1/completions bodies.

Fields this server does not honour are refused by name (request_fields.py); known
fields with a wrong type or range are rejected with the field named, as OpenAI does.
Fields left out take the node's defaults (models/generation_defaults.py).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass

from aiohttp import web

from ..engine.decoding_rules import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, DecodingRules
from ..engine.sampling import SamplingParams
from ..models.generation_defaults import GenerationDefaults
from .errors import ApiError
from .request_fields import must_be_boolean, must_be_string, optional_field

ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_STOP_STRINGS = 4
MAX_CHOICES = 16  # n: each choice is a whole generation
# What a client may send back of an assistant message it got (openai's message objects dump these).
_ECHOED_MESSAGE_KEYS = {"refusal", "annotations", "audio", "function_call", "reasoning_content"}


@dataclass
class CompletionParams:
    model: str | None
    sampling: SamplingParams
    max_tokens: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    n: int = 1
    rules: DecodingRules | None = None  # logprobs, penalties, bias (a grammar is added by the route)
    echo: bool = False  # legacy completions: the prompt comes back before the completion
    token_ids: bool = False  # legacy completions' return_token_ids: each choice's generated ids beside its text
    speculate: bool = True  # False: no draft tokens in its decode steps (entry/speculation.py)

    def with_rules(self, **changes) -> DecodingRules | None:
        """The rules with `changes` (a grammar), or None when nothing is asked of the sampler."""
        rules = DecodingRules(**{**(vars(self.rules) if self.rules else {}), **changes})
        return None if rules == DecodingRules() else rules


BODY_TIMEOUT_S = 30.0  # a client trickling its body must not hold a handler forever
BODY_TIMEOUT = web.AppKey("body_timeout", float)  # the app's own, when it sets one (--http-timeout)
# What aiohttp decodes itself; any other Content-Encoding would reach us still encoded.
CONTENT_ENCODINGS = {"identity", "gzip", "deflate"}


LARGE_BODY_BYTES = 64 * 1024


async def read_json_object(request: web.Request) -> dict:
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in CONTENT_ENCODINGS:
        raise ApiError(415, f"Content-Encoding {encoding!r} is not supported; use one of "
                            f"{sorted(CONTENT_ENCODINGS)}", code="unsupported_content_encoding")
    timeout = request.app.get(BODY_TIMEOUT, BODY_TIMEOUT_S)
    try:
        async with asyncio.timeout(timeout):
            raw = await request.read()
    except TimeoutError:
        raise ApiError(408, f"request body did not arrive within {timeout:.0f} s", code="timeout")
    except web.RequestPayloadError as e:  # e.g. a body that is not the gzip its header says
        raise ApiError(400, f"request body could not be decoded as {encoding}: {e.__cause__ or e}")
    if not raw:
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:  # a body of MBs takes the parser tens of ms: not on the event loop
        body = json.loads(raw) if len(raw) < LARGE_BODY_BYTES else await asyncio.to_thread(json.loads, raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"request body is not valid JSON: {e}")
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply to be a chat request")
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, not {type(body).__name__}")
    return body


def parse_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array of messages", param="messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def _message(m, where: str) -> dict:
    if not isinstance(m, dict):
        raise ApiError(400, f"{where} must be an object", param=where)
    role = m.get("role")
    if role not in ROLES:
        raise ApiError(400, f"{where}.role must be one of {sorted(ROLES)}, got {role!r}", param=f"{where}.role")
    for key, value in m.items():
        if key not in {"role", "content", "name", "tool_calls", "tool_call_id"} | _ECHOED_MESSAGE_KEYS:
            raise ApiError(400, f"{where}.{key} is not supported", param=f"{where}.{key}")
        if key in ("audio", "function_call") and value is not None:
            raise ApiError(400, f"{where}.{key} is not supported (use tool_calls)", param=f"{where}.{key}")
    out = {"role": "system" if role == "developer" else role}
    content = m.get("content")
    tool_calls = m.get("tool_calls") if role == "assistant" else None
    if content is None and not tool_calls:
        # As OpenAI: every message needs content, except an assistant message that calls tools.
        raise ApiError(400, f"{where}.content is required for a {role} message", param=f"{where}.content")
    out["content"] = None if content is None else _message_text(content, where)
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    if tool_calls:
        out["tool_calls"] = _tool_calls(tool_calls, f"{where}.tool_calls")
    elif m.get("tool_calls") is not None and role != "assistant":
        raise ApiError(400, f"{where}.tool_calls is only for assistant messages", param=f"{where}.tool_calls")
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise ApiError(400, f"{where}.tool_call_id is required for a tool message", param=f"{where}.tool_call_id")
        out["tool_call_id"] = m["tool_call_id"]
    return out


def _tool_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise ApiError(400, f"{where} must be an array", param=where)
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if (not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments"), str)
                or c.get("type", "function") != "function"):
            raise ApiError(400, f"{where}[{j}] must be {{'id': ..., 'type': 'function', 'function': {{'name': "
                                f"string, 'arguments': JSON string}}}}", param=f"{where}[{j}]")
        out.append({"id": str(c.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": f["name"], "arguments": valid_text(f["arguments"], f"{where}[{j}]")}})
    return out


def _message_text(content, where: str) -> str:
    if isinstance(content, str):
        return valid_text(content, f"{where}.content")
    if isinstance(content, list):  # content parts: only text is supported
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{where}.content[{j}] must be a text part {{'type': 'text', 'text': ...}}",
                               param=f"{where}.content")
            texts.append(valid_text(part["text"], f"{where}.content"))
        return "".join(texts)
    raise ApiError(400, f"{where}.content must be a string or an array of text parts", param=f"{where}.content")


def parse_prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string", param="prompt")
    return valid_text(prompt, "prompt")


def valid_text(text: str, param: str) -> str:
    """JSON may carry lone UTF-16 surrogates ("\\ud800"), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{param} is not valid Unicode (it holds a lone surrogate)", param=param) from None
    return text


def parse_params(body: dict, max_tokens_limit: int, vocab_size: int, defaults: GenerationDefaults,
                 chat: bool) -> CompletionParams:
    model = optional_field(body, "model", must_be_string)
    n = opt_int(body, "n", 1, MAX_CHOICES) or 1
    best_of = opt_int(body, "best_of", 1, MAX_CHOICES)
    if best_of is not None and best_of != n:
        raise ApiError(400, "'best_of' other than n is not supported (every choice generated is returned)",
                       param="best_of")

    max_tokens = opt_int(body, "max_completion_tokens", 1, None)
    if max_tokens is None:
        max_tokens = opt_int(body, "max_tokens", 1, None)
    if max_tokens is not None and max_tokens > max_tokens_limit:
        raise ApiError(400, f"max_tokens={max_tokens} exceeds this model's context of {max_tokens_limit} tokens",
                       param="max_tokens")

    temperature = opt_number(body, "temperature", 0.0, 2.0, default=defaults.temperature)
    top_p = opt_number(body, "top_p", 0.0, 1.0, default=defaults.top_p)
    if top_p == 0.0:
        raise ApiError(400, "'top_p' must be greater than 0", param="top_p")
    top_k = opt_int(body, "top_k", 0, vocab_size, "the vocabulary size")
    top_k = defaults.top_k if top_k is None else top_k
    seed = opt_int(body, "seed", -(2**63), 2**64 - 1)
    if seed is None:  # drawn once per request, so a replay after churn draws the same tokens
        seed = random.getrandbits(63)

    stream = optional_field(body, "stream", must_be_boolean) or False
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    for key in options:
        if key not in ("include_usage", "include_obfuscation"):
            raise ApiError(400, f"stream_options.{key} is not supported", param="stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise ApiError(400, "'stream_options.include_usage' must be a boolean", param="stream_options")
    if options and not stream:
        raise ApiError(400, "'stream_options' is only allowed with stream: true", param="stream_options")

    echo = body.get("echo", False) if not chat else False
    if not isinstance(echo, bool):
        raise ApiError(400, "'echo' must be a boolean", param="echo")
    token_ids = body.get("return_token_ids", False) if not chat else False
    if not isinstance(token_ids, bool):
        raise ApiError(400, "'return_token_ids' must be a boolean", param="return_token_ids")
    speculate = optional_field(body, "speculate", must_be_boolean)
    logprobs = _logprobs(body, chat)
    rules = DecodingRules(
        logit_bias=_logit_bias(body, vocab_size),
        presence_penalty=opt_number(body, "presence_penalty", -2.0, 2.0, default=0.0),
        frequency_penalty=opt_number(body, "frequency_penalty", -2.0, 2.0, default=0.0),
        repetition_penalty=opt_number(body, "repetition_penalty", 0.0, 10.0, default=defaults.repetition_penalty),
        logprobs=logprobs, echo_logprobs=echo and logprobs is not None)
    if rules.repetition_penalty == 0.0:
        raise ApiError(400, "'repetition_penalty' must be greater than 0 (1 is off)", param="repetition_penalty")
    return CompletionParams(model, SamplingParams(temperature, top_p, top_k, seed % 2**64), max_tokens,
                            _parse_stop(body.get("stop")), stream, include_usage, n,
                            None if rules == DecodingRules() else rules, echo, token_ids,
                            speculate is not False)


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives to give with each token's logprob; None: no logprobs."""
    if not chat:  # legacy completions: logprobs is that number
        return opt_int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    wanted = optional_field(body, "logprobs", must_be_boolean)
    top = opt_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else None


def _logit_bias(body: dict, vocab_size: int) -> tuple[tuple[int, float], ...]:
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
        raise ApiError(400, f"'logit_bias' must map at most {MAX_LOGIT_BIAS} token ids to numbers",
                       param="logit_bias")
    out = []
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if not 0 <= token < vocab_size or str(token) != str(key).strip():
            raise ApiError(400, f"'logit_bias' key {key!r} is not a token id of this model (0-{vocab_size - 1})",
                           param="logit_bias")
        if not is_number(value) or not -100 <= value <= 100:
            raise ApiError(400, f"'logit_bias' values must be numbers from -100 to 100, got {value!r}",
                           param="logit_bias")
        if value:
            out.append((token, float(value)))
    return tuple(sorted(out))


def _parse_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "'stop' must be a string or an array of strings", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' takes at most {MAX_STOP_STRINGS} strings", param="stop")
    return [valid_text(s, "stop") for s in stop if s]


def is_integer(v) -> bool:
    """A JSON integer (true and false are not, though Python counts them as ints)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    """A JSON number, integer or not (never true or false)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def opt_int(body: dict, name: str, lo: int | None, hi: int | None, hi_name: str = "") -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not is_integer(v):
        raise ApiError(400, f"'{name}' must be an integer, got {json.dumps(v)}", param=name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        upper = f"{hi} ({hi_name})" if hi_name else hi if hi is not None else "the context size"
        raise ApiError(400, f"'{name}' must be between {lo} and {upper}, got {v}", param=name)
    return v


def opt_number(body: dict, name: str, lo: float, hi: float, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not is_number(v):
        raise ApiError(400, f"'{name}' must be a number, got {json.dumps(v)}", param=name)
    if not lo <= v <= hi:
        raise ApiError(400, f"'{name}' must be between {lo} and {hi}, got {v}", param=name)
    return float(v)
