"""An Anthropic Messages body (/v1/messages, /v1/messages/count_tokens), checked and turned into the
chat form every face shares: messages as request_parsing gives them, tools as tool_params does.

`system` becomes the first message; a user message's `tool_result` blocks become `tool`
messages (before its text, as Anthropic orders them); an assistant's `tool_use` blocks
become its tool_calls. Images, documents, thinking and server tools are refused by name:
this server cannot read or do them. A last assistant message (a prefill the answer would
continue) is refused too: the chat template opens a new turn. Errors name Anthropic's fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .errors import ApiError
from .request_fields import check_fields
from .request_parsing import is_integer, is_number, valid_text
from .tool_params import MAX_TOOLS, ToolRequest, check_tool_name

MESSAGE_FIELDS = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p",
                  "top_k", "tools", "tool_choice", "output_config", "thinking",
                  # no effect on the answer (request_fields.NO_EFFECT)
                  "metadata", "service_tier", "cache_control", "inference_geo", "speed"}
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "output_config", "thinking", "cache_control"}
MAX_STOP_SEQUENCES = 16  # each is checked against the text at every token
_UNSERVED = {"image": "images", "document": "documents", "search_result": "search results",
             "container_upload": "container uploads", "thinking": "thinking blocks",
             "redacted_thinking": "thinking blocks", "server_tool_use": "server tools",
             "web_search_tool_result": "server tools", "mcp_tool_use": "MCP tools", "mcp_tool_result": "MCP tools"}


@dataclass
class MessagesRequest:
    model: str | None
    messages: list[dict]  # the chat form (request_parsing.parse_messages)
    tools: ToolRequest
    schema: dict | None  # output_config.format: the JSON schema the answer follows
    max_tokens: int | None  # 0: nothing generated (Anthropic's way to warm a prompt cache)
    stop: list[str]
    stream: bool
    sampling: dict = field(default_factory=dict)  # temperature, top_p, top_k in chat-completions form
    ignored: list[str] = field(default_factory=list)  # accepted without effect (request_fields)


def parse_messages_request(body: dict, reasoning: bool, count_only: bool = False) -> MessagesRequest:
    ignored = check_fields(body, COUNT_FIELDS if count_only else MESSAGE_FIELDS, reasoning)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "model: must be a string", param="model")
    ignored += _thinking(body.get("thinking"), reasoning)
    schema, more = _output_config(body.get("output_config"), reasoning)
    ignored += more
    messages = _system(body.get("system")) + _messages(body.get("messages"))
    if "cache_control" not in ignored and _marks_cache(body):
        ignored.append("cache_control")  # on blocks or tools: a caching hint, whatever it marks
    tools = _tools(body.get("tools"), body.get("tool_choice"))
    if schema is not None and tools.offered:
        raise ApiError(400, "output_config.format together with tools is not supported; send tool_choice "
                            "{'type': 'none'} or leave one out", param="output_config")
    if count_only:
        return MessagesRequest(model, messages, tools, schema, None, [], False, ignored=ignored)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise ApiError(400, "max_tokens: Field required", param="max_tokens")
    if not is_integer(max_tokens) or max_tokens < 0:
        raise ApiError(400, f"max_tokens: must be a non-negative integer, got {json.dumps(max_tokens)}",
                       param="max_tokens")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "stream: must be a boolean", param="stream")
    sampling = {}
    for name, lo, hi in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        value = body.get(name)
        if value is None:
            continue
        if not is_number(value) or not lo <= value <= hi:
            raise ApiError(400, f"{name}: must be a number from {lo:g} to {hi:g}, got {json.dumps(value)}",
                           param=name)
        sampling[name] = value
    top_k = body.get("top_k")
    if top_k is not None:
        if not is_integer(top_k) or top_k < 0:
            raise ApiError(400, f"top_k: must be a non-negative integer, got {json.dumps(top_k)}", param="top_k")
        sampling["top_k"] = top_k
    return MessagesRequest(model, messages, tools, schema, max_tokens, _stop_sequences(body.get("stop_sequences")),
                           bool(stream), sampling, ignored)


def _thinking(thinking, reasoning: bool) -> list[str]:
    if thinking is None:
        return []
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled" and not reasoning:
        return ["thinking"]  # asks a model that does not think for nothing
    if kind in ("enabled", "adaptive", "disabled"):
        raise ApiError(400, f"thinking: {{'type': {kind!r}}} cannot be honoured: this server does not "
                            f"control its model's thinking", param="thinking")
    raise ApiError(400, "thinking: must be {'type': 'enabled' | 'disabled' | 'adaptive', ...}", param="thinking")


def _output_config(config, reasoning: bool) -> tuple[dict | None, list[str]]:
    """output_config: its JSON schema (applied), and its effort (accepted without effect unless the model
    reasons)."""
    if config is None:
        return None, []
    if not isinstance(config, dict):
        raise ApiError(400, "output_config: must be an object", param="output_config")
    for key in config:
        if key not in ("format", "effort"):
            raise ApiError(400, f"output_config.{key}: is not supported", param="output_config")
    ignored = []
    if config.get("effort") is not None:
        if reasoning:
            raise ApiError(400, "output_config.effort: cannot be honoured: this model reasons, and how much is "
                                "not something this server controls", param="output_config")
        if config["effort"] not in ("low", "medium", "high", "xhigh", "max"):
            raise ApiError(400, "output_config.effort: must be 'low', 'medium', 'high', 'xhigh' or 'max'",
                           param="output_config")
        ignored.append("output_config.effort")
    fmt = config.get("format")
    if fmt is None:
        return None, ignored
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise ApiError(400, "output_config.format: must be {'type': 'json_schema', 'schema': {...}}",
                       param="output_config")
    return fmt["schema"], ignored


def _system(system) -> list[dict]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": valid_text(system, "system")}] if system else []
    if not isinstance(system, list):
        raise ApiError(400, "system: must be a string or an array of text blocks", param="system")
    texts = [_text_block(b, f"system[{i}]") for i, b in enumerate(system)]
    return [{"role": "system", "content": "\n".join(texts)}] if texts else []


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: must be a non-empty array of messages", param="messages")
    out: list[dict] = []
    calls_before: set[str] = set()  # the tool_use ids of the assistant turn just before
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where}: must be an object", param=where)
        for key in m:
            if key not in ("role", "content"):
                raise ApiError(400, f"{where}.{key}: Extra inputs are not permitted", param=f"{where}.{key}")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise ApiError(400, f"{where}.role: must be 'user' or 'assistant', got {role!r}", param=f"{where}.role")
        blocks = _blocks(m.get("content"), where)
        if role == "user":
            out += _user(blocks, where, calls_before)
            calls_before = set()
        else:
            message, calls_before = _assistant(blocks, where)
            out.append(message)
    if messages[-1].get("role") == "assistant":
        raise ApiError(400, f"messages[{len(messages) - 1}]: a last assistant message (a prefill for the answer "
                            f"to continue) is not supported; end with a user message", param="messages")
    return out


def _blocks(content, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        raise ApiError(400, f"{where}.content: must be a string or a non-empty array of content blocks",
                       param=f"{where}.content")
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in _UNSERVED:
            raise ApiError(400, f"{where}.content[{j}]: {kind!r} blocks are not supported: this server's model "
                                f"reads text only ({_UNSERVED[kind]} cannot be served)",
                           param=f"{where}.content[{j}].type")
        if kind not in ("text", "tool_use", "tool_result"):
            raise ApiError(400, f"{where}.content[{j}].type: must be 'text', 'tool_use' or 'tool_result', "
                                f"got {kind!r}", param=f"{where}.content[{j}].type")
    return content


def _text_block(block, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise ApiError(400, f"{where}: must be a text block {{'type': 'text', 'text': ...}}", param=where)
    return valid_text(block["text"], where)


def _user(blocks: list[dict], where: str, calls_before: set[str]) -> list[dict]:
    results, texts = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block["type"] == "text":
            texts.append(_text_block(block, at))
        elif block["type"] == "tool_result":
            results.append(_tool_result(block, at, calls_before))
        else:
            raise ApiError(400, f"{at}: 'tool_use' blocks are the assistant's, not the user's", param=f"{at}.type")
    return results + ([{"role": "user", "content": "\n".join(texts)}] if texts or not results else [])


def _tool_result(block: dict, where: str, calls_before: set[str]) -> dict:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise ApiError(400, f"{where}.tool_use_id: Field required", param=f"{where}.tool_use_id")
    if call_id not in calls_before:
        raise ApiError(400, f"{where}.tool_use_id: {call_id!r} answers no tool_use block of the assistant message "
                            f"just before", param=f"{where}.tool_use_id")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = valid_text(content, f"{where}.content")
    elif isinstance(content, list):
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _UNSERVED:
                raise ApiError(400, f"{where}.content[{k}]: {kind!r} blocks are not supported: this server's "
                                    f"model reads text only", param=f"{where}.content[{k}].type")
        text = "\n".join(_text_block(p, f"{where}.content[{k}]") for k, p in enumerate(content))
    else:
        raise ApiError(400, f"{where}.content: must be a string or an array of text blocks", param=f"{where}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise ApiError(400, f"{where}.is_error: must be a boolean", param=f"{where}.is_error")
    return {"role": "tool", "tool_call_id": call_id, "content": f"Error: {text}" if is_error else text}


def _assistant(blocks: list[dict], where: str) -> tuple[dict, set[str]]:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block["type"] == "text":
            texts.append(_text_block(block, at))
        elif block["type"] == "tool_use":
            call_id, name, args = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(args, dict):
                raise ApiError(400, f"{at}: a tool_use block needs 'id' (string), 'name' (string) and 'input' "
                                    f"(object)", param=at)
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": valid_text(json.dumps(args, ensure_ascii=False),
                                                                             f"{at}.input")}})
        else:
            raise ApiError(400, f"{at}: 'tool_result' blocks are the user's, not the assistant's", param=f"{at}.type")
    message = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message, {c["id"] for c in calls}


def _tools(tools, choice) -> ToolRequest:
    if tools is None:
        tools = []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ApiError(400, f"tools: must be an array of at most {MAX_TOOLS} tools", param="tools")
    functions = [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]
    names = [f["function"]["name"] for f in functions]
    if len(set(names)) != len(names):
        raise ApiError(400, "tools: names a tool twice", param="tools")
    if choice is None:
        return ToolRequest(functions, "auto" if functions else "none")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise ApiError(400, "tool_choice: must be {'type': 'auto' | 'any' | 'tool' | 'none', ...}",
                       param="tool_choice")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "tool_choice.disable_parallel_tool_use: must be a boolean", param="tool_choice")
    # Anthropic allows several calls unless told not to; a small model forced to call then repeats its
    # call until max_tokens, so several are allowed only when the client says so (false), as on chat.
    several = parallel is False
    if kind in ("any", "tool") and not functions:
        raise ApiError(400, f"tool_choice: {{'type': {kind!r}}} needs 'tools'", param="tool_choice")
    if kind == "tool":
        name = choice.get("name")
        if name not in names:
            raise ApiError(400, f"tool_choice.name: {name!r} is not among 'tools' ({names})", param="tool_choice")
        return ToolRequest(functions, "function", name, several)
    return ToolRequest(functions, {"any": "required"}.get(kind, kind), None, several)


def _tool(tool, where: str) -> dict:
    if not isinstance(tool, dict):
        raise ApiError(400, f"{where}: must be an object", param=where)
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise ApiError(400, f"{where}.type: {kind!r} is a server tool, which this server does not run; only "
                            f"client tools ({{'name', 'description', 'input_schema'}}) are supported",
                       param=f"{where}.type")
    for key in tool:
        if key not in ("type", "name", "description", "input_schema", "cache_control", "strict"):
            raise ApiError(400, f"{where}.{key}: is not supported", param=f"{where}.{key}")
    check_tool_name(tool.get("name"), f"{where}.name")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"{where}.description: must be a string", param=f"{where}.description")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ApiError(400, f"{where}.input_schema: must be a JSON schema of type 'object'",
                       param=f"{where}.input_schema")
    function = {"name": tool["name"], **({"description": description} if description else {}), "parameters": schema}
    valid_text(json.dumps(function, ensure_ascii=False), where)  # the prompt shows it all: no lone surrogates
    return {"type": "function", "function": function}


def _marks_cache(body: dict) -> bool:
    """Does any system block, content block (or a tool result's block) or tool carry a cache_control?"""
    blocks = [*(body["system"] if isinstance(body.get("system"), list) else []), *(body.get("tools") or [])]
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        for block in content if isinstance(content, list) else []:
            blocks.append(block)
            if isinstance(block, dict) and isinstance(block.get("content"), list):
                blocks += block["content"]
    return any(isinstance(b, dict) and b.get("cache_control") is not None for b in blocks)


def _stop_sequences(stop) -> list[str]:
    if stop is None:
        return []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "stop_sequences: must be an array of strings", param="stop_sequences")
    if len(stop) > MAX_STOP_SEQUENCES:
        raise ApiError(400, f"stop_sequences: at most {MAX_STOP_SEQUENCES} are supported", param="stop_sequences")
    return [valid_text(s, "stop_sequences") for s in stop if s]
