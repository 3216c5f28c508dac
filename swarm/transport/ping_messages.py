"""Pings over the data lane: how long a frame to a peer takes there and back (node/link_meter.py).

A Ping travels the data lane like any frame (sealed in a closed swarm, held by the frame-hold switch
like any frame: transport/frame_hold.py), and the peer's MLX thread answers with Pong as soon as it
reads it (node/inbox.py). A Ping may carry padding, at most MAX_PAD_BYTES, which the peer only reads:
the time a padded ping takes beyond a bare one is what that many bytes take on the link.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import ProtocolError
from .frames import Frame
from .wire_fields import int_field

MAX_PAD_BYTES = 256 * 1024
MAX_NONCE = 2**63 - 1


class Ping(NamedTuple):
    """Answer with Pong(nonce) once read; the padding is only read."""

    T = "ping"
    nonce: int
    pad: int = 0

    def to_frame(self) -> tuple[dict, bytes]:
        return {"t": "ping", "n": self.nonce}, bytes(self.pad)

    @classmethod
    def from_frame(cls, frame: Frame) -> Ping:
        if len(frame.payload) > MAX_PAD_BYTES:
            raise ProtocolError(f"'ping' message: at most {MAX_PAD_BYTES} bytes of padding, got {len(frame.payload)}")
        return cls(int_field(frame.header, "n", 0, MAX_NONCE), len(frame.payload))


class Pong(NamedTuple):
    """The answer to the Ping with this nonce."""

    T = "pong"
    nonce: int

    def to_frame(self) -> tuple[dict, bytes]:
        return {"t": "pong", "n": self.nonce}, b""

    @classmethod
    def from_frame(cls, frame: Frame) -> Pong:
        if frame.payload:
            raise ProtocolError("'pong' message: no payload expected")
        return cls(int_field(frame.header, "n", 0, MAX_NONCE))
