"""One Responses answer as it is built: its output items, and the stream events that build it.

The service's events (TextDelta, Finished) go in; out come the streaming events of
OpenAI's Responses API, each with its sequence number: response.created and
.in_progress, then per output item .output_item.added, for a message
.content_part.added, .output_text.delta... .output_text.done, .content_part.done, for a
function call .function_call_arguments.delta and .done, then .output_item.done, and
last response.completed (or response.incomplete when max_output_tokens cut it). A call
reaches the builder whole (entry/tool_call_output.py), so its arguments come in one delta.
A non-streaming request uses the same builder and keeps only the final object.
"""

from __future__ import annotations

import time
import uuid

from ..entry.service import Finished, TextDelta, TokenScore
from .response_shapes import TokenTexts


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    def __init__(self, model: str, echo: dict, texts: TokenTexts | None = None):
        self.id, self.model, self.echo = _id("resp"), model, echo
        self.texts = texts  # set when the request asked for logprobs
        self.created_at = int(time.time())
        self.output: list[dict] = []
        self.sequence = 0
        self.done: Finished | None = None
        self._message: dict | None = None  # the message item being written, if one is open

    def opening(self) -> list[dict]:
        snapshot = self.snapshot("in_progress")
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def add(self, ev: TextDelta | Finished) -> list[dict]:
        """The stream events one service event makes."""
        if isinstance(ev, Finished):
            events = [] if self.output else self._text("")  # an empty answer is still one (empty) message
            self.done = ev
            events += self._close_message()
            status = self.status
            return events + [self._event(f"response.{status}", response=self.snapshot(status))]
        events = self._text(ev.text, ev.logprobs) if ev.text or (ev.logprobs and self.texts) else []
        for call in ev.tool_calls:
            events += self._close_message() + self._call(call)
        return events

    @property
    def status(self) -> str:
        return "incomplete" if self.done is not None and self.done.reason == "length" else "completed"

    def snapshot(self, status: str) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        usage = None
        if self.done is not None:
            prompt, out = self.done.prompt_tokens, self.done.completion_tokens
            usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                     "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": prompt + out}
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "background": False, "error": None, "incomplete_details": incomplete, "model": self.model,
                "output": [dict(item) for item in self.output] if status != "in_progress" else [],
                **self.echo, "usage": usage, **({"swarm": self.done.route} if self.done and self.done.route else {})}

    def assistant_messages(self) -> list[dict]:
        """The answer as chat messages (what a follow-up with previous_response_id continues from)."""
        text = "".join(p["text"] for item in self.output if item["type"] == "message" for p in item["content"])
        calls = [{"id": item["call_id"], "type": "function",
                  "function": {"name": item["name"], "arguments": item["arguments"]}}
                 for item in self.output if item["type"] == "function_call"]
        return [{"role": "assistant", "content": text or (None if calls else ""),
                 **({"tool_calls": calls} if calls else {})}]

    def _text(self, text: str, scores: list[TokenScore] = ()) -> list[dict]:
        events = []
        if self._message is None:
            self._message = {"id": _id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                             "content": []}
            self.output.append(self._message)
            events += [self._event("response.output_item.added", output_index=self._index,
                                   item={**self._message, "content": []}),
                       self._event("response.content_part.added", item_id=self._message["id"],
                                   output_index=self._index, content_index=0, part=_text_part(""))]
            self._message["content"].append(_text_part(""))
        part = self._message["content"][0]
        part["text"] += text
        logprobs = [self._logprob(s) for s in scores] if self.texts is not None else []
        part["logprobs"] += logprobs
        if text or logprobs:
            events.append(self._event("response.output_text.delta", item_id=self._message["id"],
                                      output_index=self._index, content_index=0, delta=text, logprobs=logprobs))
        return events

    def _logprob(self, s: TokenScore) -> dict:
        def entry(token: int, logprob: float) -> dict:
            text, raw = self.texts(token)
            return {"token": text, "bytes": raw, "logprob": logprob}
        return {**entry(s.token, s.logprob), "top_logprobs": [entry(t, lp) for t, lp in s.top]}

    def _close_message(self) -> list[dict]:
        message, self._message = self._message, None
        if message is None:
            return []
        index = self.output.index(message)
        message["status"] = "completed"
        part = message["content"][0]
        return [self._event("response.output_text.done", item_id=message["id"], output_index=index,
                            content_index=0, text=part["text"], logprobs=list(part["logprobs"])),
                self._event("response.content_part.done", item_id=message["id"], output_index=index,
                            content_index=0, part=dict(part)),
                self._event("response.output_item.done", output_index=index, item=dict(message))]

    def _call(self, call: dict) -> list[dict]:
        f = call["function"]
        item = {"id": _id("fc"), "type": "function_call", "status": "in_progress", "call_id": call["id"],
                "name": f["name"], "arguments": ""}
        self.output.append(item)
        index = len(self.output) - 1
        events = [self._event("response.output_item.added", output_index=index, item=dict(item)),
                  self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                              delta=f["arguments"])]
        item.update(arguments=f["arguments"], status="completed")
        return events + [self._event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=index, name=f["name"], arguments=f["arguments"]),
                         self._event("response.output_item.done", output_index=index, item=dict(item))]

    @property
    def _index(self) -> int:
        return len(self.output) - 1

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
