"""`tools`, `tool_choice` and `parallel_tool_calls` of a chat request, checked as OpenAI does."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .errors import ApiError
from .request_parsing import valid_text

MAX_TOOLS = 128
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict]  # OpenAI's form: {"type": "function", "function": {"name", "description"?, "parameters"?}}
    choice: str  # "auto", "none", "required" or "function" (a named one)
    name: str | None = None  # the function tool_choice names
    parallel: bool = False  # several calls in one forced answer: only when the client says so (see parse_tools)

    @property
    def offered(self) -> list[dict] | None:
        """The tools the model is told about (none when it may not call any)."""
        return self.tools if self.tools and self.choice != "none" else None

    @property
    def forced(self) -> list[dict]:
        """The functions the answer must call (required / named); [] when the model decides."""
        if self.choice == "required":
            return [t["function"] for t in self.tools]
        if self.choice == "function":
            return [t["function"] for t in self.tools if t["function"]["name"] == self.name]
        return []


def parse_tools(body: dict) -> ToolRequest:
    tools = [_tool(t, i) for i, t in enumerate(_list(body.get("tools")))]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise ApiError(400, "'tools' names a function twice", param="tools")
    # OpenAI's default is true, but a forced answer that may hold several calls lets a small model
    # repeat its call until max_tokens (seen with SmolLM2): it gets several only when it asks.
    parallel = body.get("parallel_tool_calls")
    if parallel is None:
        parallel = False
    if not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
    choice = body.get("tool_choice")
    if choice is None:
        return ToolRequest(tools, "auto" if tools else "none", None, parallel)
    if choice in ("auto", "none", "required"):
        if choice != "none" and not tools:
            raise ApiError(400, f"tool_choice {choice!r} needs 'tools'", param="tool_choice")
        return ToolRequest(tools, choice, None, parallel)
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if name not in names:
            raise ApiError(400, f"tool_choice names function {name!r}, which is not among 'tools' ({names})",
                           param="tool_choice")
        return ToolRequest(tools, "function", name, parallel)
    raise ApiError(400, "'tool_choice' must be 'none', 'auto', 'required' or "
                        "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")


def _list(tools) -> list:
    if tools is None:
        return []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ApiError(400, f"'tools' must be an array of at most {MAX_TOOLS} tools", param="tools")
    return tools


def check_tool_name(name, where: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ApiError(400, f"{where} must be 1-64 letters, digits, '_' or '-', got {name!r}", param=where)
    return name


def _tool(tool, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise ApiError(400, f"{where} must be {{'type': 'function', 'function': {{...}}}} (only function tools "
                            f"are supported)", param=where)
    f = tool["function"]
    name = check_tool_name(f.get("name"), f"{where}.function.name")
    description = f.get("description")
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"{where}.function.description must be a string", param=f"{where}.function.description")
    parameters = f.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}  # OpenAI: no parameters means none
    if not isinstance(parameters, dict):
        raise ApiError(400, f"{where}.function.parameters must be a JSON schema object",
                       param=f"{where}.function.parameters")
    strict = f.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(400, f"{where}.function.strict must be a boolean", param=f"{where}.function.strict")
    function = {"name": name, **({"description": description} if description else {}), "parameters": parameters}
    valid_text(json.dumps(function, ensure_ascii=False), where)  # the prompt shows it all: no lone surrogates
    return {"type": "function", "function": function}
