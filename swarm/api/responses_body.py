"""The body of POST /v1/responses, checked field by field and turned into what the shared parsers take.

`input` (a string or items: messages, function_call, function_call_output) and
`instructions` become chat messages; function `tools`, `tool_choice` and `text.format`
are rewritten into chat completions' form and parsed by tool_params / response_format,
the sampling fields and logprobs by request_parsing, so a Responses request is decoded exactly as
the same chat request is. Errors name the Responses field (`input[2].content`,
`max_output_tokens`, `text.format`) in OpenAI's error shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ApiError, renamed_params
from .request_fields import (check_fields, must_be_boolean, must_be_object, must_be_one_of, must_be_string,
                             optional_field)
from .request_parsing import CompletionParams, is_integer, valid_text
from .response_format import parse_response_format
from .tool_params import ToolRequest, parse_tools

# Applied (or, for store / metadata, done as asked).
HONOURED = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
            "max_output_tokens", "temperature", "top_p", "stream", "previous_response_id", "store", "metadata",
            "include", "top_logprobs"}
_APPLIED_HERE = frozenset({"store", "metadata"})  # without effect on the other faces (request_fields.NO_EFFECT)
_BACKGROUND = "background responses are not supported; 'background' may only be false"


def _positive_integer(name: str, value) -> str | None:
    return None if is_integer(value) and value >= 1 else f"'{name}' must be a positive integer"


# Accepted, changing nothing here: named in the x-swarm-ignored header and the log. Ignored fields are
# still checked (a wrong type is a mistake the client should hear of): these with the checks here, the
# rest with request_fields.NO_EFFECT's.
_OWN_NO_EFFECT = {"reasoning": must_be_object, "stream_options": must_be_object,
                  "truncation": must_be_one_of("auto", "disabled"), "background": must_be_boolean,
                  "max_tool_calls": _positive_integer}
NO_EFFECT_FIELDS = set(_OWN_NO_EFFECT) | {"service_tier", "safety_identifier", "prompt_cache_key",
                                          "prompt_cache_retention", "user"}
_WHY_NOT = {
    "conversation": "conversations are not stored here; use 'previous_response_id' or send the whole 'input'",
    "prompt": "stored prompt templates are not supported; send 'instructions' and 'input'",
}
LOGPROBS = "message.output_text.logprobs"
# include: extra output this server never has (reasoning, tool results); asking for it changes nothing.
_INCLUDABLE_NOTHING = {"reasoning.encrypted_content", "file_search_call.results", "web_search_call.results",
                       "web_search_call.action.sources", "message.input_image.image_url",
                       "computer_call_output.output.image_url", "code_interpreter_call.outputs"}
_ROLES = {"user", "system", "developer", "assistant"}
_TEXT_PARTS = {"input_text", "output_text", "text"}
MAX_INPUT_ITEMS = 4096


@dataclass
class ResponsesRequest:
    instructions: str | None
    input_messages: list[dict]  # chat messages from `input` (what a later previous_response_id replays)
    tools: ToolRequest
    schema: dict | None
    params: CompletionParams
    previous_response_id: str | None
    store: bool
    echo: dict = field(default_factory=dict)  # fields the response object repeats as sent
    ignored: list[str] = field(default_factory=list)

    def messages(self, earlier: list[dict]) -> list[dict]:
        """The conversation to render: the instructions (never carried over), earlier turns, this input."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return system + earlier + self.input_messages


def parse_responses_body(body: dict, params_of) -> ResponsesRequest:
    """`params_of(chat_body)`: the shared sampling parser (generation.Generation.params)."""
    ignored = _check_fields(body)
    instructions = optional_field(body, "instructions", must_be_string)
    instructions = valid_text(instructions, "instructions") if instructions else None
    messages = parse_input(body.get("input"))
    chat: dict = {"model": body.get("model"), "temperature": body.get("temperature"), "top_p": body.get("top_p"),
                  "stream": body.get("stream"), "max_tokens": body.get("max_output_tokens"),
                  "parallel_tool_calls": body.get("parallel_tool_calls"),
                  "tools": _chat_tools(body.get("tools")), "tool_choice": _chat_tool_choice(body.get("tool_choice")),
                  "response_format": _chat_format(body.get("text"))}
    if LOGPROBS in (body.get("include") or []) or body.get("top_logprobs"):  # as chat's logprobs
        chat.update(logprobs=True, top_logprobs=body.get("top_logprobs"))
    with renamed_params({"max_tokens": "max_output_tokens", "response_format": "text.format",
                         r"tools\[(\d+)\]\.function": r"tools[\1]"}):
        tools = parse_tools(chat)
        schema = parse_response_format(chat)
        params = params_of(chat)
    if body.get("max_tool_calls") is not None and tools.parallel:
        raise ApiError(400, "'max_tool_calls' is only supported without parallel_tool_calls (then an answer holds "
                            "at most one call)", param="max_tool_calls", code="unsupported_parameter")
    if schema is not None and tools.offered:
        raise ApiError(400, "text.format json_schema / json_object together with tools is not supported; send "
                            "tool_choice 'none' or leave one out", param="text.format")
    previous = optional_field(body, "previous_response_id", must_be_string)
    store = optional_field(body, "store", must_be_boolean)
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise ApiError(400, "'metadata' must be an object of at most 16 string values", param="metadata")
    echo = {"instructions": instructions, "metadata": metadata or {}, "max_output_tokens": params.max_tokens,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "parallel_tool_calls": tools.parallel, "previous_response_id": previous,
            "store": store is not False, "text": {"format": _format_echo(body.get("text"))},
            "tool_choice": body.get("tool_choice") or ("auto" if tools.tools else "none"),
            "tools": body.get("tools") or [], "truncation": "disabled", "user": body.get("user"),
            "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
            "top_logprobs": body.get("top_logprobs")}
    return ResponsesRequest(instructions, messages, tools, schema, params, previous, store is not False, echo,
                            ignored)


def _check_fields(body: dict) -> list[str]:
    """400 naming the first field that would not be honoured; the accepted ones that change nothing."""
    ignored = check_fields(body, HONOURED | NO_EFFECT_FIELDS, no_effect=_OWN_NO_EFFECT, why_not=_WHY_NOT,
                           only={"background": ({False}, _BACKGROUND)}, applied=_APPLIED_HERE)
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
        raise ApiError(400, "'include' must be an array of strings", param="include")
    for v in include:
        if v not in _INCLUDABLE_NOTHING | {LOGPROBS}:
            raise ApiError(400, f"include {v!r} is not supported", param="include", code="unsupported_parameter")
    if set(include) - {LOGPROBS}:
        ignored.append("include")
    text = body.get("text")
    if isinstance(text, dict) and text.get("verbosity") is not None:
        if text["verbosity"] not in ("low", "medium", "high"):
            raise ApiError(400, "text.verbosity must be 'low', 'medium' or 'high'", param="text.verbosity")
        ignored.append("text.verbosity")
    return ignored


def parse_input(items) -> list[dict]:
    """`input` as chat messages (OpenAI chat form: tool_calls with JSON-string arguments, tool messages)."""
    if isinstance(items, str):
        return [{"role": "user", "content": valid_text(items, "input")}]
    if not isinstance(items, list) or not items:
        raise ApiError(400, "'input' must be a string or a non-empty array of input items", param="input")
    if len(items) > MAX_INPUT_ITEMS:
        raise ApiError(400, f"'input' holds at most {MAX_INPUT_ITEMS} items", param="input")
    out: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an object", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            call = _function_call(item, where)
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)  # the calls of one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(_function_call_output(item, where))
        else:
            raise ApiError(400, f"{where}.type {kind!r} is not supported (input items may be 'message', "
                                f"'function_call' or 'function_call_output')", param=f"{where}.type")
    return out


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in _ROLES:
        raise ApiError(400, f"{where}.role must be one of {sorted(_ROLES)}, got {role!r}", param=f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        text = valid_text(content, f"{where}.content")
    elif isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
                texts.append(valid_text(part["text"], at))
            elif kind == "refusal" and isinstance(part.get("refusal"), str):
                texts.append(valid_text(part["refusal"], at))
            else:
                raise ApiError(400, f"{at} must be a text part {{'type': 'input_text', 'text': ...}} (this model "
                                    f"reads text only), got type {kind!r}", param=at)
        text = "".join(texts)
    else:
        raise ApiError(400, f"{where}.content must be a string or an array of text parts", param=f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": text}


def _function_call(item: dict, where: str) -> dict:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise ApiError(400, f"{where}.{key} must be a string (a function_call item has call_id, name and "
                                f"arguments)", param=f"{where}.{key}")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": valid_text(item["name"], f"{where}.name"),
                         "arguments": valid_text(item["arguments"], f"{where}.arguments")}}


def _function_call_output(item: dict, where: str) -> dict:
    if not isinstance(item.get("call_id"), str):
        raise ApiError(400, f"{where}.call_id must be a string", param=f"{where}.call_id")
    output = item.get("output")
    if isinstance(output, list):  # text parts
        if not all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
                   for p in output):
            raise ApiError(400, f"{where}.output parts must be text parts (this model reads text only)",
                           param=f"{where}.output")
        output = "".join(p["text"] for p in output)
    if not isinstance(output, str):
        raise ApiError(400, f"{where}.output must be a string or an array of text parts", param=f"{where}.output")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": valid_text(output, f"{where}.output")}


def _chat_tools(tools):
    """Responses' flat function tools in chat completions' nested form (the shared parser checks the rest)."""
    if not isinstance(tools, list):
        return tools  # None, or a wrong type for parse_tools to name
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise ApiError(400, f"tools[{i}] has type {kind!r}: only function tools are supported (hosted tools "
                                f"such as web or file search are not)", param=f"tools[{i}].type")
        unknown = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if unknown:
            raise ApiError(400, f"tools[{i}].{sorted(unknown)[0]} is not supported",
                           param=f"tools[{i}].{sorted(unknown)[0]}")
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _chat_tool_choice(choice):
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise ApiError(400, "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', "
                                "'name': ...}", param="tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _chat_format(text):
    if text is None:
        return None
    if not isinstance(text, dict):
        raise ApiError(400, "'text' must be an object {'format': {...}}", param="text")
    unknown = set(text) - {"format", "verbosity"}
    if unknown:
        raise ApiError(400, f"text.{sorted(unknown)[0]} is not supported", param=f"text.{sorted(unknown)[0]}")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ApiError(400, "text.format must be an object", param="text.format")
    if fmt.get("type") == "json_schema":
        spec = {k: v for k, v in fmt.items() if k in ("name", "schema", "strict", "description")}
        if "schema" not in fmt:
            raise ApiError(400, "text.format json_schema needs 'schema'", param="text.format")
        return {"type": "json_schema", "json_schema": spec}
    return fmt


def _format_echo(text) -> dict:
    fmt = text.get("format") if isinstance(text, dict) else None
    return fmt if isinstance(fmt, dict) else {"type": "text"}
