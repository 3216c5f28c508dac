"""Bodies of Ollama's POST /api/chat and /api/generate, checked and turned into what the shared parsers take.

Messages become chat messages (tool calls with JSON-string arguments and ids, tool results
linked to the call they answer), `tools` are already chat completions' form, `format`
("json" or a schema) becomes the schema the answer is held to, and `options` map onto
the chat-completions sampling fields (num_predict -> max_tokens, repeat_penalty ->
repetition_penalty), parsed by request_parsing, so the answer is decoded as the same chat
request's is. Errors name Ollama's field (`options.num_predict`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .errors import ApiError, renamed_params
from .request_fields import check_fields, must_be_boolean, must_be_string, optional_field
from .request_parsing import CompletionParams, is_integer, is_number, valid_text
from .response_format import ANY_OBJECT
from .tool_params import ToolRequest, parse_tools

# options -> the chat-completions field that applies it
_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed", "stop": "stop",
            "num_predict": "max_tokens", "repeat_penalty": "repetition_penalty",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
            "speculate": "speculate"}  # ours: false turns drafts off (entry/speculation.py)
# Runtime settings of Ollama's own server: nothing of the answer depends on them here.
_RUNTIME_OPTIONS = {"num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
                    "use_mmap", "use_mlock", "embedding_only", "num_thread", "numa", "num_keep", "penalize_newline"}
# Samplers this server does not have, accepted only at the value that turns them off.
_OFF_VALUES = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0, "min_p": 0.0}
_CHAT_FIELDS = {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think", "logprobs",
                "top_logprobs"}
_GENERATE_FIELDS = {"model", "prompt", "suffix", "system", "template", "context", "raw", "format", "options",
                    "stream", "keep_alive", "images", "think", "logprobs", "top_logprobs"}
_ROLES = {"system", "user", "assistant", "tool"}


def _keep_alive(name: str, value) -> str | None:
    ok = isinstance(value, str) or is_number(value)
    return None if ok else f"'{name}' must be a duration (\"5m\") or a number of seconds"


_NO_EFFECT = {"keep_alive": _keep_alive}  # the swarm's model stays loaded whatever is asked
_FILL_IN = {"suffix": ({""}, "fill-in-the-middle ('suffix') is not supported")}


@dataclass
class OllamaRequest:
    model: str
    messages: list[dict] | None  # chat messages; None for a raw /api/generate prompt
    raw_prompt: str | None
    tools: ToolRequest
    schema: dict | None
    params: CompletionParams
    until_full: bool  # num_predict < 0: generate until the context is full
    ignored: list[str] = field(default_factory=list)

    @property
    def loads_only(self) -> bool:
        """An empty request is Ollama's way to load a model: answered at once, nothing generated."""
        return not self.messages and not self.raw_prompt


def parse_chat_body(body: dict, params_of) -> OllamaRequest:
    """`params_of(chat_body)`: the shared sampling parser (generation.Generation.params)."""
    ignored = check_fields(body, _CHAT_FIELDS, no_effect=_NO_EFFECT)
    messages = body.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise ApiError(400, "'messages' must be an array of messages", param="messages")
    chat = _messages(messages or [], ignored)
    tools = _tools(body)
    return _request(body, chat, None, tools, params_of, ignored)


def parse_generate_body(body: dict, params_of) -> OllamaRequest:
    ignored = check_fields(body, _GENERATE_FIELDS, no_effect=_NO_EFFECT, only=_FILL_IN)
    prompt = optional_field(body, "prompt", must_be_string)
    system = optional_field(body, "system", must_be_string)
    for name, why in (("template", "a custom prompt 'template' is not supported; the model's own chat template "
                                   "is used (or send 'raw': true with the whole prompt)"),
                      ("context", "'context' (token ids of an earlier answer) is not supported; send the "
                                  "conversation to /api/chat instead"),
                      ("images", "images are not supported: this model reads text only")):
        if body.get(name):
            raise ApiError(400, why, param=name)
    raw = optional_field(body, "raw", must_be_boolean)
    prompt = valid_text(prompt or "", "prompt")
    if raw:
        if system:
            raise ApiError(400, "'system' cannot be used with 'raw': true (the raw prompt is sent as it is)",
                           param="system")
        return _request(body, None, prompt or None, ToolRequest([], "none"), params_of, ignored)
    messages = ([{"role": "system", "content": valid_text(system, "system")}] if system else []) + \
        ([{"role": "user", "content": prompt}] if prompt else [])
    return _request(body, messages if prompt else [], None, ToolRequest([], "none"), params_of, ignored)


def _request(body: dict, messages, raw_prompt, tools: ToolRequest, params_of, ignored: list[str]) -> OllamaRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required (a model name, as /api/tags lists it)", param="model")
    stream = optional_field(body, "stream", must_be_boolean)
    chat, until_full = _options(body.get("options"), ignored)
    chat["stream"] = stream is not False  # Ollama streams unless told not to
    chat["logprobs"], chat["top_logprobs"] = body.get("logprobs"), body.get("top_logprobs")  # as chat's
    names = {name: f"options.{option}" for option, name in _OPTIONS.items()}
    with renamed_params(names):
        params = params_of(chat)
    if body.get("think") not in (None, False):
        raise ApiError(400, "this model does not think; 'think' may only be false", param="think")
    schema = _format(body.get("format"))
    if schema is not None and tools.offered:
        raise ApiError(400, "'format' together with 'tools' is not supported: send one or the other", param="format")
    return OllamaRequest(model, messages, raw_prompt, tools, schema, params, until_full, ignored)


def _options(options, ignored: list[str]) -> tuple[dict, bool]:
    """options as chat-completions fields; and whether num_predict asks for no limit (-1, -2)."""
    if options is None:
        return {}, False
    if not isinstance(options, dict):
        raise ApiError(400, "'options' must be an object", param="options")
    chat: dict = {}
    until_full = False
    for name, value in options.items():
        if value is None:
            continue
        if name in _OPTIONS:
            if name == "num_predict" and is_integer(value) and value in (-1, -2):
                until_full = True
                continue
            chat[_OPTIONS[name]] = value
        elif name in _RUNTIME_OPTIONS:
            ignored.append(f"options.{name}")
        elif name in _OFF_VALUES and is_number(value) and value == _OFF_VALUES[name]:
            ignored.append(f"options.{name}")
        elif name == "repeat_last_n" and options.get("repeat_penalty") in (None, 1, 1.0):
            ignored.append(f"options.{name}")  # the window of a penalty that is off
        else:
            why = (f"options.{name} is not supported here (only at {_OFF_VALUES[name]}, which turns it off)"
                   if name in _OFF_VALUES else f"options.{name} is not supported here")
            raise ApiError(400, why, param=f"options.{name}")
    return chat, until_full


def _format(fmt) -> dict | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return ANY_OBJECT
    if isinstance(fmt, dict):
        return fmt
    raise ApiError(400, "'format' must be \"json\" or a JSON schema object", param="format")


def _tools(body: dict) -> ToolRequest:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "'tools' must be an array of tools", param="tools")
    return parse_tools({"tools": tools or None})  # Ollama has no tool_choice: the model decides ("auto")


def _messages(messages: list, ignored: list[str]) -> list[dict]:
    out: list[dict] = []
    unanswered: list[dict] = []  # calls of the last assistant turn that no tool message has answered yet
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object", param=where)
        role = m.get("role")
        if role not in _ROLES:
            raise ApiError(400, f"{where}.role must be one of {sorted(_ROLES)}, got {role!r}", param=f"{where}.role")
        for key, value in m.items():
            if key not in {"role", "content", "images", "tool_calls", "tool_name", "tool_call_id", "thinking"}:
                raise ApiError(400, f"{where}.{key} is not supported", param=f"{where}.{key}")
        if m.get("images"):
            raise ApiError(400, f"{where}.images: images are not supported, this model reads text only",
                           param=f"{where}.images")
        if m.get("thinking"):
            if "messages[].thinking" not in ignored:
                ignored.append("messages[].thinking")  # an earlier model's thoughts: this model never reads them
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise ApiError(400, f"{where}.content must be a string", param=f"{where}.content")
        message = {"role": role, "content": valid_text(content or "", f"{where}.content")}
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise ApiError(400, f"{where}.tool_calls is only for assistant messages", param=f"{where}.tool_calls")
            message["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls", i)
            unanswered = list(message["tool_calls"])
            if not message["content"]:
                message["content"] = None
        if role == "tool":
            message["tool_call_id"] = _answered_call(m, unanswered, where)
        out.append(message)
    return out


def _tool_calls(calls, where: str, turn: int) -> list[dict]:
    if not isinstance(calls, list):
        raise ApiError(400, f"{where} must be an array", param=where)
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise ApiError(400, f"{where}[{j}] must be {{'function': {{'name': ..., 'arguments': {{...}}}}}}",
                           param=f"{where}[{j}]")
        arguments = f.get("arguments", {})
        if not isinstance(arguments, (dict, str)):
            raise ApiError(400, f"{where}[{j}].function.arguments must be an object", param=f"{where}[{j}]")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = c.get("id") if isinstance(c.get("id"), str) else f"call_{turn}_{j}"
        out.append({"id": call_id, "type": "function",
                    "function": {"name": f["name"], "arguments": valid_text(arguments, f"{where}[{j}]")}})
    return out


def _answered_call(m: dict, unanswered: list[dict], where: str) -> str:
    """Which call a tool message answers: its tool_call_id, else the first open call of its tool_name."""
    for key in ("tool_call_id", "tool_name"):
        if m.get(key) is not None and not isinstance(m[key], str):
            raise ApiError(400, f"{where}.{key} must be a string", param=f"{where}.{key}")
    if m.get("tool_call_id"):
        return m["tool_call_id"]
    for call in unanswered:
        if m.get("tool_name") in (None, call["function"]["name"]):
            unanswered.remove(call)
            return call["id"]
    return f"call_{m.get('tool_name') or 'unknown'}"
