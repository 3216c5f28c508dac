"""Stored responses on an entry node, for `previous_response_id`: bounded in count, size and age.

Event loop only. Each entry keeps the response object (GET /v1/responses/{id}) and the
conversation it ended (its input after any earlier turns, then its answer as an assistant
message), which a follow-up continues. The oldest go first when a bound is passed; an id
that is gone, or was never stored here (another entry node, or `store: false`), is a 400
naming it. Nothing is written to disk: a restart forgets every response.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass

from .errors import ApiError

MAX_RESPONSES = 1000
MAX_STORED_CHARS = 32 * 1024 * 1024  # the conversations' JSON, all together
MAX_AGE_S = 3600.0


@dataclass
class Stored:
    response: dict
    conversation: list[dict]  # chat messages, instructions left out (they are never carried over)
    chars: int
    at: float


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_STORED_CHARS,
                 max_age_s: float = MAX_AGE_S, clock=time.monotonic):
        self.max_responses, self.max_chars, self.max_age_s = max_responses, max_chars, max_age_s
        self._clock = clock
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self.chars = 0

    def put(self, response: dict, conversation: list[dict]) -> None:
        chars = len(json.dumps(conversation)) + len(json.dumps(response))
        if chars > self.max_chars:
            return  # larger than the whole store: a follow-up gets the not-stored error
        self._items[response["id"]] = Stored(response, conversation, chars, self._clock())
        self.chars += chars
        self._expire()
        while len(self._items) > self.max_responses or self.chars > self.max_chars:
            self._drop(next(iter(self._items)))

    def conversation(self, response_id: str, param: str = "previous_response_id") -> list[dict]:
        return self.get(response_id, param).conversation

    def get(self, response_id: str, param: str = "response_id") -> Stored:
        self._expire()
        stored = self._items.get(response_id)
        if stored is None:
            raise ApiError(404 if param == "response_id" else 400,
                           f"response {response_id!r} is not stored on this node: an unknown id, one stored with "
                           f"'store': false or on another entry node, or one gone (this node keeps its last "
                           f"{self.max_responses} responses for {self.max_age_s / 60:.0f} minutes); send the whole "
                           f"conversation as 'input' instead", param=param, code="previous_response_not_found"
                           if param == "previous_response_id" else "response_not_found")
        return stored

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        self._drop(response_id)

    def __len__(self) -> int:
        return len(self._items)

    def _expire(self) -> None:
        cutoff = self._clock() - self.max_age_s
        while self._items:
            oldest_id, oldest = next(iter(self._items.items()))
            if oldest.at >= cutoff:
                break
            self._drop(oldest_id)

    def _drop(self, response_id: str) -> None:
        self.chars -= self._items.pop(response_id).chars
