"""What an Anthropic Messages answer looks like on the wire: the whole message, and its stream events.

The answer's content blocks come in the order the model wrote them: a text block while it
writes text, a tool_use block for each tool call (whole, as tool_call_output gives it), a
new text block if it writes on. A stream says the same with Anthropic's events:
message_start, ping, content_block_start / content_block_delta (text_delta, or the call's
arguments as one input_json_delta) / content_block_stop per block, message_delta with
the stop_reason and usage, message_stop.
"""

from __future__ import annotations

import json
import uuid

from ..entry.service import Finished, TextDelta

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

Event = tuple[str, dict]  # (event name, data)


def stop_reason(done: Finished) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for how a completion ended."""
    if done.reason == "stop" and done.stop_sequence is not None:
        return "stop_sequence", done.stop_sequence
    return STOP_REASONS.get(done.reason, "end_turn"), None


class MessageShape:
    def __init__(self, model: str):
        self.id, self.model = f"msg_{uuid.uuid4().hex[:24]}", model

    def _message(self, content: list[dict], reason: str | None, sequence: str | None, usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": usage}

    def whole(self, blocks: list[dict], done: Finished) -> dict:
        reason, sequence = stop_reason(done)
        return {**self._message(blocks, reason, sequence, _usage(done.prompt_tokens, done.completion_tokens)),
                **({"swarm": done.route} if done.route else {})}

    def start(self, prompt_tokens: int) -> Event:
        return "message_start", {"type": "message_start",
                                 "message": self._message([], None, None, _usage(prompt_tokens, 0))}

    def end(self, done: Finished) -> list[Event]:
        reason, sequence = stop_reason(done)
        return [("message_delta", {"type": "message_delta",
                                   "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                   "usage": _usage(done.prompt_tokens, done.completion_tokens)}),
                ("message_stop", {"type": "message_stop"})]


def _usage(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


class ContentBlocks:
    """The answer's blocks, built from its text events; each add gives the stream events it makes."""

    def __init__(self):
        self.blocks: list[dict] = []
        self._text_open = False

    def add(self, delta: TextDelta) -> list[Event]:
        events: list[Event] = []
        if delta.text:
            if not self._text_open:
                self._text_open = True
                self.blocks.append({"type": "text", "text": ""})
                events.append(("content_block_start", {"type": "content_block_start", "index": self._at,
                                                       "content_block": {"type": "text", "text": ""}}))
            self.blocks[-1]["text"] += delta.text
            events.append(("content_block_delta", {"type": "content_block_delta", "index": self._at,
                                                   "delta": {"type": "text_delta", "text": delta.text}}))
        for call in delta.tool_calls:
            events += self._close_text()
            block = {"type": "tool_use", "id": _tool_use_id(call["id"]), "name": call["function"]["name"],
                     "input": {}}
            arguments = call["function"]["arguments"]
            self.blocks.append({**block, "input": _arguments(arguments)})
            events += [("content_block_start", {"type": "content_block_start", "index": self._at,
                                                "content_block": block}),
                       ("content_block_delta", {"type": "content_block_delta", "index": self._at,
                                                "delta": {"type": "input_json_delta", "partial_json": arguments}}),
                       ("content_block_stop", {"type": "content_block_stop", "index": self._at})]
        return events

    def finish(self) -> list[Event]:
        return self._close_text()

    @property
    def _at(self) -> int:
        return len(self.blocks) - 1

    def _close_text(self) -> list[Event]:
        if not self._text_open:
            return []
        self._text_open = False
        return [("content_block_stop", {"type": "content_block_stop", "index": self._at})]


def _tool_use_id(call_id: str) -> str:
    """tool_call_output's ids are OpenAI's `call_...`; Anthropic's clients know `toolu_...`."""
    return "toolu_" + call_id.removeprefix("call_")


def _arguments(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:  # a model's own tool parser gave arguments that are not JSON: kept as they came
        return {"arguments": arguments}
