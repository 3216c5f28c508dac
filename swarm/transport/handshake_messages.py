"""The handshake's messages (handshake.py, link_handshake.py): what opens every frame connection.

Typed like the data path's (messages.py): immutable NamedTuples with `to_frame()` and a
checking `from_frame()`; messages.decode knows them too.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import ProtocolError
from .frames import Frame
from .link_crypto import NONCE_BYTES, PROOF_BYTES
from .wire_fields import MAX_TEXT_CHARS, brief, text_field

PURPOSE_CHARS = 32


def _blob(h: dict, key: str, size: int) -> bytes:
    """An optional field of exactly `size` bytes (b"" when absent)."""
    value = h.get(key, b"")
    if type(value) is not bytes or len(value) not in (0, size):
        raise ProtocolError(f"{h.get('t')!r} message: {key!r} must be {size} bytes, got {brief(value)}")
    return value


class Hello(NamedTuple):
    """Opens every frame connection, in both directions: who we are, what we speak, what the link is for.

    With a swarm secret each side adds a fresh nonce, and the answering side its proof
    of the secret (transport/link_crypto.py); without one both are empty."""

    T = "hello"
    version: int
    node_id: str
    swarm: str
    purpose: str = "data"  # "data" (the lane), or a purpose served on the event loop (listener.py)
    nonce: bytes = b""
    proof: bytes = b""

    def to_frame(self) -> tuple[dict, bytes]:
        header = {"t": "hello", "v": self.version, "node_id": self.node_id, "swarm": self.swarm,
                  "purpose": self.purpose}
        if self.nonce:
            header["nonce"] = self.nonce
        if self.proof:
            header["proof"] = self.proof
        return header, b""

    @classmethod
    def from_frame(cls, frame: Frame) -> Hello:
        h = frame.header
        version = h.get("v")
        if type(version) is not int:
            raise ProtocolError(f"'hello' message: 'v' must be an integer, got {brief(version)}")
        swarm = h.get("swarm")
        if not isinstance(swarm, str) or len(swarm) > 255:
            raise ProtocolError(f"'hello' message: 'swarm' must be a string, got {brief(swarm)}")
        purpose = h.get("purpose", "data")
        if not isinstance(purpose, str) or not purpose.isidentifier() or len(purpose) > PURPOSE_CHARS:
            raise ProtocolError(f"'hello' message: 'purpose' must be a short name, got {brief(purpose)}")
        return cls(version, text_field(h, "node_id"), swarm, purpose, _blob(h, "nonce", NONCE_BYTES),
                   _blob(h, "proof", PROOF_BYTES))


class Proof(NamedTuple):
    """The dialing side's proof of the swarm secret, after the answering side's hello proved it."""

    T = "proof"
    proof: bytes

    def to_frame(self) -> tuple[dict, bytes]:
        return {"t": "proof", "proof": self.proof}, b""

    @classmethod
    def from_frame(cls, frame: Frame) -> Proof:
        proof = _blob(frame.header, "proof", PROOF_BYTES)
        if not proof:
            raise ProtocolError("'proof' message without a proof")
        return cls(proof)


class Admitted(NamedTuple):
    """The answering side checked the dialer's proof and keeps the link: the first sealed frame."""

    T = "admit"

    def to_frame(self) -> tuple[dict, bytes]:
        return {"t": "admit"}, b""

    @classmethod
    def from_frame(cls, frame: Frame) -> Admitted:
        return cls()


class Rejection(NamedTuple):
    """Why a hello was refused; the last frame on that connection."""

    T = "error"  # reserved for the handshake since version 1
    KINDS = frozenset({"version", "swarm", "protocol", "node", "duplicate", "auth", "purpose"})
    kind: str
    message: str

    def to_frame(self) -> tuple[dict, bytes]:
        return {"t": "error", "kind": self.kind, "message": self.message[:MAX_TEXT_CHARS]}, b""

    @classmethod
    def from_frame(cls, frame: Frame) -> Rejection:
        h = frame.header
        kind, message = h.get("kind"), h.get("message")
        # A newer peer may refuse for a reason we do not know: still a refusal, named as it came.
        return cls(kind if isinstance(kind, str) else "protocol",
                   message[:MAX_TEXT_CHARS] if isinstance(message, str) else "")


HANDSHAKE_MESSAGES = (Hello, Proof, Admitted, Rejection)
