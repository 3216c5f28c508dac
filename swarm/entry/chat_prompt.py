"""Chat messages and tools to prompt text, through the model's own chat template.

A template that renders tools (Qwen, Hermes, Llama 3.1, Mistral, ...) gets them as
mlx-lm's server hands them over: `tools=`, past assistant `tool_calls` with their
arguments as objects, `tool` messages as they are; its output is parsed with the
tool parser mlx-lm picked for it (tokenizer_utils). A template that ignores tools
(found by rendering a probe with and without one) gets what llama.cpp does for such
models: a system message describing the tools and the call format, past calls and
results written into the conversation as text, in the Hermes / Qwen `json_tools`
form, which its output is then parsed in.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Callable

from mlx_lm.tool_parsers import json_tools

from .grammars import TOOL_CALL_END, TOOL_CALL_START

_PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_tool", "description": "A probe.",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}
_PROBE = [{"role": "user", "content": "hello"}]

# Qwen 2.5's own words (its template is the common json_tools one).
TOOLS_SYSTEM_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


class TemplateRejected(ValueError):
    """The chat template refused the conversation (e.g. roles that must alternate)."""


@dataclass(frozen=True)
class ToolFormat:
    """How tool calls look in this model's output, and how they are parsed."""

    start: str
    end: str
    parse: Callable  # mlx-lm tool parser: (text between the markers, tools) -> {"name", "arguments"} or a list
    is_json_tools: bool  # the form our grammars force (entry/grammars.py)


JSON_TOOLS = ToolFormat(TOOL_CALL_START, TOOL_CALL_END, json_tools.parse_tool_call, True)


class ChatPrompt:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.renders_tools = self._renders_tools()
        # The model writes its reasoning between think markers (mlx-lm's tokenizer finds them).
        self.reasons = bool(getattr(tokenizer, "has_thinking", False))
        parser = getattr(tokenizer, "tool_parser", None)
        if self.renders_tools and getattr(tokenizer, "has_tool_calling", False) and parser is not None:
            start, end = tokenizer.tool_call_start, tokenizer.tool_call_end or ""
            self.tool_format = ToolFormat(start, end, parser,
                                          (start, end) == (TOOL_CALL_START, TOOL_CALL_END)
                                          and getattr(parser, "__module__", "") == json_tools.__name__)
        else:
            self.tool_format = JSON_TOOLS

    def _renders_tools(self) -> bool:
        try:
            return self._apply(_PROBE, [_PROBE_TOOL]) != self._apply(_PROBE, None)
        except Exception:  # a template that cannot even render the probe does not render tools
            return False

    def _apply(self, messages: list[dict], tools: list[dict] | None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """messages as the API parsed them (tool_calls with JSON-string arguments); tools in OpenAI's form
        (None: do not offer any)."""
        if self.renders_tools:
            native, offered = [_native(m) for m in messages], tools or None
        else:
            native, offered = _as_text(messages, tools), None
        try:
            return self._apply(native, offered)
        except Exception as e:  # jinja's TemplateError, or whatever the template raises itself
            raise TemplateRejected(f"the model's chat template cannot render these messages: "
                                   f"{type(e).__name__}: {e}") from e


def _native(message: dict) -> dict:
    """What templates that know tools expect (mlx-lm server's process_message_content)."""
    m = copy.deepcopy(message)
    for call in m.get("tool_calls") or []:
        call["function"]["arguments"] = _arguments_object(call["function"]["arguments"])
    if m.get("content") is None:
        m["content"] = ""
    return m


def _as_text(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """The conversation for a template that ignores tools: everything about tools written as text."""
    out: list[dict] = []
    if tools:
        described = TOOLS_SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if messages and messages[0]["role"] == "system":
            out.append({"role": "system", "content": f"{messages[0]['content']}\n\n{described}"})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": described})
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [_call_text(c["function"]) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(filter(None, [m.get("content") or "", *calls]))})
        elif m["role"] == "tool":
            response = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):  # consecutive results share one turn, as Qwen does
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_tool_results": True})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]


def _call_text(function: dict) -> str:
    call = {"name": function["name"], "arguments": _arguments_object(function["arguments"])}
    return f"{TOOL_CALL_START}\n{json.dumps(call, ensure_ascii=False)}\n{TOOL_CALL_END}"


def _arguments_object(arguments):
    """Arguments arrive as a JSON string (OpenAI's form); templates want the object."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments  # not JSON: the template shows it as it is
    return arguments
