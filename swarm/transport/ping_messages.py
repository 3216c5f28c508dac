"""Pings over the data lane: how long a frame to a peer takes there and back (node/link_meter.py).

A Ping travels the data lane like any frame (sealed in a closed swarm, held by the frame-hold switch
like any frame: transport/frame_hold.py), and the peer's MLX thread answers with Pong as soon as it
reads it (node/inbox.py). A Ping may carry padding, at most MAX_PAD_BYTES, which the peer only reads:
the time a padded ping takes beyond a bare one is what that many bytes take on the link.

The peer's MLX thread reads the ping only between its passes, so the Pong says how long the ping may
have waited there: `quiet_us`, how far back from reading it the thread had done next to no work
(engine/busy_spans.py); a ping that took longer than that there and back may have waited behind a
pass. 0: it may have waited whatever its round trip (the Pong itself left late: transport/lane.py).
None, the field absent: a peer that does not say (its round trips are no samples).
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import ProtocolError
from .frames import Frame
from .wire_fields import int_field

MAX_PAD_BYTES = 256 * 1024
MAX_NONCE = 2**63 - 1
MAX_QUIET_US = 2**40  # (about 12 days: a peer says less, and more is a lie)


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
    """The answer to the Ping with this nonce, and how long that ping may have waited for it (above)."""

    T = "pong"
    nonce: int
    quiet_us: int | None = None

    @classmethod
    def answering(cls, nonce: int, quiet_s: float) -> Pong:
        return cls(nonce, min(MAX_QUIET_US, max(0, int(quiet_s * 1e6))))

    def waited(self) -> Pong:
        """This Pong left late (its sender's thread was busy): its ping may have waited any time."""
        return self._replace(quiet_us=0)

    def quiet_s(self) -> float | None:
        return None if self.quiet_us is None else self.quiet_us / 1e6

    def to_frame(self) -> tuple[dict, bytes]:
        header = {"t": "pong", "n": self.nonce}
        if self.quiet_us is not None:
            header["q"] = self.quiet_us
        return header, b""

    @classmethod
    def from_frame(cls, frame: Frame) -> Pong:
        if frame.payload:
            raise ProtocolError("'pong' message: no payload expected")
        h = frame.header
        return cls(int_field(h, "n", 0, MAX_NONCE), None if h.get("q") is None else int_field(h, "q", 0, MAX_QUIET_US))
