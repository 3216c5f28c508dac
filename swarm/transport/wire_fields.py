"""The checks of a peer message's header fields, each naming what is wrong.

The slow path: a message's `from_frame` checks its hot fields inline (one comparison
each) and calls these to build the error, or for the fields of rare messages.
"""

from __future__ import annotations

from typing import Any

from .errors import ProtocolError

MAX_ID_CHARS = 128  # request, plan and node ids
MAX_TEXT_CHARS = 4096  # error messages


def text_field(h: dict, key: str, max_chars: int = MAX_ID_CHARS, empty: bool = False) -> str:
    value = h.get(key)
    if not isinstance(value, str) or (not value and not empty) or len(value) > max_chars:
        raise text_error(h, key, max_chars)
    return value


def text_error(h: dict, key: str, max_chars: int = MAX_ID_CHARS) -> ProtocolError:
    return ProtocolError(f"{h.get('t')!r} message: {key!r} must be a string of 1-{max_chars} characters, "
                         f"got {brief(h.get(key))}")


def int_field(h: dict, key: str, lo: int, hi: int) -> int:
    value = h.get(key)
    if type(value) is not int or not lo <= value <= hi:
        raise int_error(h, key, lo, hi)
    return value


def int_error(h: dict, key: str, lo: int, hi: int) -> ProtocolError:
    return ProtocolError(f"{h.get('t')!r} message: {key!r} must be an integer in [{lo}, {hi}], "
                         f"got {brief(h.get(key))}")


def is_id(value: Any) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_ID_CHARS


def brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
