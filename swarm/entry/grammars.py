"""Grammars for structured output and tool calls, in llguidance's format (engine/constraints.py).

JSON is constrained to one spacing, json.dumps' (", " and ": ", no free whitespace):
free whitespace lets a weak model loop on blanks forever. Tool calls take the
Hermes / Qwen `json_tools` form mlx-lm parses (`<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>`); a marker that is one special token of the vocabulary is named
as that token, since special tokens are never matched as text.
"""

from __future__ import annotations

import json

import llguidance as llg

from ..engine.constraints import GrammarVocab

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"


class GrammarError(ValueError):
    """A schema llguidance cannot compile (for a 400 naming the field it came from)."""


def json_schema_grammar(schema: dict) -> str:
    return llg.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_STYLE)


def json_object_grammar() -> str:
    return json_schema_grammar({"type": "object"})


def tool_call_schema(name: str, parameters: dict) -> dict:
    """The JSON object of one call of function `name` (its arguments as the function's schema)."""
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def forced_tool_calls_grammar(calls: list[dict], vocab: GrammarVocab, several: bool) -> str:
    """Output that is nothing but tool calls (tool_choice "required" or a named function): one of the
    `calls` schemas (tool_call_schema), or several in a row when `several`."""
    body = calls[0] if len(calls) == 1 else {"anyOf": calls}
    start, end = _marker(TOOL_CALL_START, vocab), _marker(TOOL_CALL_END, vocab)
    repeat = ' ("\\n" call)*' if several else ""
    lark = (f"start: call{repeat}\n"
            f"call: {start} \"\\n\" body \"\\n\" {end}\n"
            f"body: %json {json.dumps({**body, 'x-guidance': JSON_STYLE})}\n")
    return llg.LLMatcher.grammar_from_lark(lark)


def lazy_tool_calls_grammar(calls: list[dict], vocab: GrammarVocab, several: bool) -> str:
    """tool_choice "auto": free text, but once the model opens a tool call, a valid call (llguidance's
    lazy lexemes, as its StructTag writes them, with markers that may be special tokens); at most one
    call unless `several`."""
    body = calls[0] if len(calls) == 1 else {"anyOf": calls}
    start, end = _marker(TOOL_CALL_START, vocab), _marker(TOOL_CALL_END, vocab)
    if vocab.is_special(TOOL_CALL_START):  # a special token can only be the model's choice: no trigger needed
        opening = f"call: TEXT {start} \"\\n\" body \"\\n\" {end}\n"
    else:
        opening = f"call_start[lazy]: TEXT {start}\ncall: call_start \"\\n\" body \"\\n\" {end}\n"
    lark = ("%llguidance {}\n"
            f"start: {'call* tail' if several else 'tail | call tail'}\n"
            "tail: TEXT\n"
            "TEXT: /(.|\\n)*/\n"
            f"{opening}"
            f"body: %json {json.dumps({**body, 'x-guidance': JSON_STYLE})}\n")
    return llg.LLMatcher.grammar_from_lark(lark)


def checked(grammar: str, vocab: GrammarVocab) -> str:
    """The grammar, if this vocabulary can follow it; GrammarError saying why not."""
    error = vocab.check(grammar)
    if error:
        raise GrammarError(error)
    return grammar


def _marker(text: str, vocab: GrammarVocab) -> str:
    return text if vocab.is_special(text) else json.dumps(text)
