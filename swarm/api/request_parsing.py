"""Validation of /v1/chat/completions and /v1/completions bodies.

Unknown fields are ignored (clients send many optional ones); known fields with a
wrong type or range are rejected with the field named, as OpenAI does.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass

from aiohttp import web

from ..engine.sampling import SamplingParams
from .errors import ApiError

ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_STOP_STRINGS = 4


@dataclass
class CompletionParams:
    model: str | None
    sampling: SamplingParams
    max_tokens: int | None
    stop: list[str]
    stream: bool
    include_usage: bool


BODY_TIMEOUT_S = 30.0  # a client trickling its body must not hold a handler forever
BODY_TIMEOUT = web.AppKey("body_timeout", float)  # the app's own, when it sets one (--http-timeout)
# What aiohttp decodes itself; any other Content-Encoding would reach us still encoded.
CONTENT_ENCODINGS = {"identity", "gzip", "deflate"}


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
    try:
        body = json.loads(raw)
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
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(400, f"{where}.role must be one of {sorted(ROLES)}, got {role!r}", param=f"{where}.role")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _message_text(m.get("content"), where)})
    return out


def _message_text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return _valid_text(content, f"{where}.content")
    if isinstance(content, list):  # content parts: only text is supported
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{where}.content[{j}] must be a text part {{'type': 'text', 'text': ...}}",
                               param=f"{where}.content")
            texts.append(_valid_text(part["text"], f"{where}.content"))
        return "".join(texts)
    raise ApiError(400, f"{where}.content must be a string or an array of text parts", param=f"{where}.content")


def parse_prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string", param="prompt")
    return _valid_text(prompt, "prompt")


def _valid_text(text: str, param: str) -> str:
    """JSON may carry lone UTF-16 surrogates ("\\ud800"), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{param} is not valid Unicode (it holds a lone surrogate)", param=param) from None
    return text


def parse_params(body: dict, max_tokens_limit: int, vocab_size: int) -> CompletionParams:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model")
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")

    max_tokens = _opt_int(body, "max_completion_tokens", 1, None)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", 1, None)
    if max_tokens is not None and max_tokens > max_tokens_limit:
        raise ApiError(400, f"max_tokens={max_tokens} exceeds this model's context of {max_tokens_limit} tokens",
                       param="max_tokens")

    temperature = _opt_number(body, "temperature", 0.0, 2.0, default=1.0)
    top_p = _opt_number(body, "top_p", 0.0, 1.0, default=1.0)
    if top_p == 0.0:
        raise ApiError(400, "'top_p' must be greater than 0", param="top_p")
    top_k = _opt_int(body, "top_k", 0, vocab_size, "the vocabulary size") or 0
    seed = _opt_int(body, "seed", -(2**63), 2**64 - 1)
    if seed is None:  # drawn once per request, so a replay after churn draws the same tokens
        seed = random.getrandbits(63)

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise ApiError(400, "'stream_options.include_usage' must be a boolean", param="stream_options")

    return CompletionParams(model, SamplingParams(temperature, top_p, top_k, seed % 2**64),
                            max_tokens, _parse_stop(body.get("stop")), stream, include_usage)


def _parse_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "'stop' must be a string or an array of strings", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' takes at most {MAX_STOP_STRINGS} strings", param="stop")
    return [_valid_text(s, "stop") for s in stop if s]


def _opt_int(body: dict, name: str, lo: int | None, hi: int | None, hi_name: str = "") -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"'{name}' must be an integer, got {json.dumps(v)}", param=name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        upper = f"{hi} ({hi_name})" if hi_name else hi if hi is not None else "the context size"
        raise ApiError(400, f"'{name}' must be between {lo} and {upper}, got {v}", param=name)
    return v


def _opt_number(body: dict, name: str, lo: float, hi: float, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ApiError(400, f"'{name}' must be a number, got {json.dumps(v)}", param=name)
    if not lo <= v <= hi:
        raise ApiError(400, f"'{name}' must be between {lo} and {hi}, got {v}", param=name)
    return float(v)
