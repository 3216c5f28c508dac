"""The model's text, split into what the client reads (content) and the tool calls it made.

mlx-lm's TextStateMachine finds the tool-call markers in the streamed text (holding
back what may be the start of one); the text between them goes to the model's tool
parser (chat_prompt.ToolFormat). As mlx-lm's server does, a call reaches the client
whole, once its end marker is in: a streaming client gets one `tool_calls` delta per
call. A call that does not parse (cut off by max_tokens, say) is given back as
content, markers and all: nothing the model wrote is dropped, but for blank lines
around calls (the separators of their syntax).
"""

from __future__ import annotations

import json
import logging
import uuid

from mlx_lm.generate import TextStateMachine

from .chat_prompt import ToolFormat

log = logging.getLogger(__name__)


class ToolCallOutput:
    def __init__(self, fmt: ToolFormat, tools: list[dict]):
        self.fmt, self.tools = fmt, tools
        transitions = {"normal": [(fmt.start, "tool")], "tool": [(fmt.end, "normal")] if fmt.end else []}
        self._state = TextStateMachine(transitions).make_state("normal")
        self._in_call = False
        self._call_text = ""
        self._blank = ""  # whitespace held back: dropped if a call follows, shown if text does
        self.count = 0  # tool calls given out so far

    def add(self, text: str) -> tuple[str, list[dict]]:
        """Feed text; returns (content now safe to show, tool calls now complete)."""
        self._state, segments = TextStateMachine.split(self._state, text)
        return self._take(segments)

    def finish(self) -> tuple[str, list[dict]]:
        """No more text: what was held back, and a call left open (formats without an end marker)."""
        self._state, held, current = TextStateMachine.flush(self._state)
        content, calls = self._take([(current, held)])
        if self._in_call:
            more, closing = self._close_call(ended=False)
            content, calls = content + more, calls + closing
        if not self.count:
            content, self._blank = content + self._blank, ""
        return content, calls

    def _take(self, segments) -> tuple[str, list[dict]]:
        content, calls = "", []
        for state, text in segments:
            if state == "tool":
                self._in_call, self._blank = True, ""
                self._call_text += text
            else:
                if self._in_call:
                    more, closed = self._close_call()
                    content, calls = content + more, calls + closed
                content += self._text(text)
        return content, calls

    def _text(self, text: str) -> str:
        if not text.strip():
            self._blank += text
            return ""
        out, self._blank = self._blank + text, ""
        return out

    def _close_call(self, ended: bool = True) -> tuple[str, list[dict]]:
        """`ended`: the end marker was seen (else the text stopped inside the call)."""
        text, self._call_text, self._in_call = self._call_text, "", False
        try:
            parsed = self.fmt.parse(text, self.tools)
            parsed = parsed if isinstance(parsed, list) else [parsed]
            calls = [self._openai_call(p) for p in parsed]
        except Exception as e:  # the parsers raise what they raise (ValueError, JSONDecodeError, KeyError, ...)
            log.info("a tool call did not parse (%s: %s); it goes out as text", type(e).__name__, e)
            return f"{self.fmt.start}{text}{self.fmt.end if ended else ''}", []
        return "", calls

    def _openai_call(self, parsed: dict) -> dict:
        arguments = parsed["arguments"]
        call = {"index": self.count, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": str(parsed["name"]),
                             "arguments": arguments if isinstance(arguments, str)
                             else json.dumps(arguments, ensure_ascii=False)}}
        self.count += 1
        return call
