"""The data lane's own probe: does a peer read what we send it, and soon?

A peer that answers every liveness check on its event loop may still read nothing of its data
lane (a stuck MLX thread, a saturated link, an insider out to stop the swarm): frames to it wait in
the kernel's buffers and no token ever comes back. A Probe travels the data lane like any frame,
behind whatever waits for the peer there, and carries PROBE_PAD_BYTES of padding so that a peer
reading a trickle cannot answer it in time either; the peer's MLX thread answers with Probed as
soon as it reads it (node/inbox.py). Who probes and what follows: planning/slow_members.py.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import ProtocolError
from .frames import Frame
from .wire_fields import int_field

PROBE_PAD_BYTES = 64 * 1024  # read in well under a second by any peer that serves a pipeline
MAX_NONCE = 2**63 - 1


def _nonce(frame: Frame) -> int:
    return int_field(frame.header, "n", 0, MAX_NONCE)


class Probe(NamedTuple):
    """Answer with Probed(nonce) once this is read; the padding is only read."""

    T = "probe"
    nonce: int

    def to_frame(self) -> tuple[dict, bytes]:
        return {"t": "probe", "n": self.nonce}, bytes(PROBE_PAD_BYTES)

    @classmethod
    def from_frame(cls, frame: Frame) -> Probe:
        if len(frame.payload) > PROBE_PAD_BYTES:
            raise ProtocolError(f"'probe' message: at most {PROBE_PAD_BYTES} bytes of padding, got "
                                f"{len(frame.payload)}")
        return cls(_nonce(frame))


class Probed(NamedTuple):
    """The answer to the Probe with this nonce."""

    T = "probed"
    nonce: int

    def to_frame(self) -> tuple[dict, bytes]:
        return {"t": "probed", "n": self.nonce}, b""

    @classmethod
    def from_frame(cls, frame: Frame) -> Probed:
        return cls(_nonce(frame))
