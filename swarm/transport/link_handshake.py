"""The hello's steps on each side, without I/O: what to send next, and whether the other side may be trusted.

handshake.py moves the bytes (blocking on the MLX thread, asyncio on the event loop);
both use these two classes, so the rules live in one place:

    dialer   -> answerer   MAGIC, Hello(version, node_id, swarm, purpose, nonce?)
    answerer -> dialer     Hello(..., nonce?, proof?)          or a Rejection, and close
  with a swarm secret (both nonces set; link_crypto.py):
    dialer   -> answerer   Proof(HMAC(client | transcript))   or a Rejection ("auth"), and close
    answerer -> dialer     sealed Admitted                    or a Rejection, and close
    every later frame both ways is sealed (sealed_frames.py)

Without a secret (an open swarm) the first two frames are the whole handshake, as
before. A node with a secret and one without (or with another secret) refuse each
other with a Rejection of kind "auth" saying which it is, never anything derived from
the secret. The answering side takes the link (`admit`, e.g. links.py's one-link-per-
pair rule) only once the dialer has proved the secret, so a stranger can hold no
reservation in a node's name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from discovery.profile import COMPATIBLE_PROTOCOL_VERSIONS, PROTOCOL_VERSION

from .errors import HandshakeRejected, ProtocolError
from .frames import MAGIC, Frame, encode_frame
from .log_limit import LogLimiter
from .link_crypto import (FrameOpener, FrameSealer, LinkAuthError, Transcript, check_proof, link_keys, new_nonce,
                          proof)
from .handshake_messages import Admitted, Hello, Proof, Rejection

# Said to the other side and logged by both, so each names the roles, never the secret.
ANSWERER_HAS_SECRET = ("the answering node has a swarm secret and the dialing node has none (give it the same "
                       "--secret, $SWARM_SECRET or state-dir secret file)")
DIALER_HAS_SECRET = "the dialing node has a swarm secret and the answering node has none (it runs an open swarm)"
ANSWERER_NO_PROOF = ("the answering node did not prove the swarm secret: the two have different secrets, "
                     "or it is no node of this swarm")
DIALER_NO_PROOF = ("the dialing node did not prove the swarm secret: the two have different secrets, it "
                   "replayed an old handshake, or it is no node of this swarm")


@dataclass(frozen=True)
class LinkAuth:
    """What this node brings to every handshake."""

    node_id: str
    swarm: str
    key: bytes | None = None  # the stretched swarm secret (link_crypto.stretch_secret); None: an open swarm
    # Why handshakes failed, each said once per address and reason (handshake.note_refusal): one per node.
    refusals: LogLimiter = field(default_factory=lambda: LogLimiter(logging.getLogger("swarm.transport")),
                                 compare=False, repr=False)


@dataclass
class LinkCipher:
    """A sealed link's two halves: ours to send, theirs to open (one each per connection)."""

    sealer: FrameSealer
    opener: FrameOpener


class Refused(HandshakeRejected):
    """This side refuses the other: `reply` (a Rejection frame) tells the other side why, before the close."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(kind, message)
        self.reply = frame_bytes(Rejection(kind, message))


def frame_bytes(message) -> bytes:
    return b"".join(bytes(p) for p in encode_frame(*message.to_frame()))


def check_hello(frame: Frame, swarm: str) -> Hello:
    """The other side's hello; HandshakeRejected for a refusal it sent, Refused if we must not talk to it."""
    if frame.header["t"] == Rejection.T:
        refused = Rejection.from_frame(frame)
        raise HandshakeRejected(refused.kind, f"refused by the other side: {refused.message}")
    if frame.header["t"] != Hello.T:
        raise Refused("protocol", f"expected a hello frame, got {frame.header['t']!r}")
    try:
        hello = Hello.from_frame(frame)
    except ProtocolError as e:
        raise Refused("protocol", str(e)) from None
    if hello.version not in COMPATIBLE_PROTOCOL_VERSIONS:
        raise Refused("version", f"protocol version {hello.version!r} not in {sorted(COMPATIBLE_PROTOCOL_VERSIONS)}")
    if hello.swarm != swarm:
        raise Refused("swarm", f"swarm {hello.swarm!r} is not {swarm!r}")
    return hello


def _other_side_refusal(frame: Frame, expected: str) -> None:
    if frame.header["t"] == Rejection.T:
        refused = Rejection.from_frame(frame)
        raise HandshakeRejected(refused.kind, f"refused by the other side: {refused.message}")
    if frame.header["t"] != expected:
        raise Refused("protocol", f"expected a {expected!r} frame, got {frame.header['t']!r}")


class DialerHandshake:
    def __init__(self, auth: LinkAuth, purpose: str = "data", expected_peer: str | None = None) -> None:
        self.auth, self.purpose, self.expected_peer = auth, purpose, expected_peer
        self.nonce = new_nonce() if auth.key is not None else b""
        self.peer: str | None = None
        self.cipher: LinkCipher | None = None

    def hello(self) -> bytes:
        a = self.auth
        return MAGIC + frame_bytes(Hello(PROTOCOL_VERSION, a.node_id, a.swarm, self.purpose, self.nonce))

    def on_answer(self, frame: Frame) -> bytes:
        """The answering side's hello: b"" when the link is ready (open swarm), else the Proof to send,
        after which `on_verdict` takes the first sealed frame."""
        hello = check_hello(frame, self.auth.swarm)
        if self.expected_peer is not None and hello.node_id != self.expected_peer:
            raise Refused("node", f"the address answered as node {hello.node_id!r}, not {self.expected_peer!r}")
        if hello.purpose != self.purpose:
            raise Refused("protocol", f"answered for {hello.purpose!r}, not {self.purpose!r}")
        self.peer = hello.node_id
        key = self.auth.key
        if key is None:
            if hello.nonce or hello.proof:
                raise Refused("auth", ANSWERER_HAS_SECRET)
            return b""
        if not hello.nonce or not hello.proof:
            raise Refused("auth", DIALER_HAS_SECRET)
        transcript = Transcript(PROTOCOL_VERSION, self.auth.swarm, self.auth.node_id, hello.node_id, self.nonce,
                                hello.nonce)
        try:
            check_proof(key, "server", transcript, hello.proof)
        except LinkAuthError:
            raise Refused("auth", ANSWERER_NO_PROOF) from None
        keys = link_keys(key, "client", transcript)
        self.cipher = LinkCipher(FrameSealer(keys.send), FrameOpener(keys.receive))
        return frame_bytes(Proof(proof(key, "client", transcript)))

    def on_verdict(self, frame: Frame) -> None:
        """The first sealed frame (already opened): Admitted, or the answering side's refusal."""
        _other_side_refusal(frame, Admitted.T)


class AnswererHandshake:
    def __init__(self, auth: LinkAuth, purposes: frozenset[str] | set[str]) -> None:
        self.auth, self.purposes = auth, purposes
        self.hello: Hello | None = None
        self.cipher: LinkCipher | None = None
        self._transcript: Transcript | None = None

    @property
    def sealed(self) -> bool:
        return self.auth.key is not None

    def on_hello(self, frame: Frame) -> bytes:
        """The dialer's hello: our own hello to answer with (after admitting it, without a secret).

        Refused with a reply for the dialer, or HandshakeRejected if the dialer sent a refusal."""
        hello = check_hello(frame, self.auth.swarm)
        if hello.purpose not in self.purposes:
            raise Refused("purpose", f"this node serves no {hello.purpose!r} links")
        if self.auth.key is None:
            if hello.nonce:
                raise Refused("auth", DIALER_HAS_SECRET)
            self.hello = hello
            return frame_bytes(Hello(PROTOCOL_VERSION, self.auth.node_id, self.auth.swarm, hello.purpose))
        if not hello.nonce:
            raise Refused("auth", ANSWERER_HAS_SECRET)
        nonce = new_nonce()
        self._transcript = Transcript(PROTOCOL_VERSION, self.auth.swarm, hello.node_id, self.auth.node_id,
                                      hello.nonce, nonce)
        self.hello = hello
        return frame_bytes(Hello(PROTOCOL_VERSION, self.auth.node_id, self.auth.swarm, hello.purpose, nonce,
                                 proof(self.auth.key, "server", self._transcript)))

    def on_proof(self, frame: Frame) -> None:
        """With a secret: the dialer's proof. After it, `cipher` seals our Admitted or Rejection."""
        _other_side_refusal(frame, Proof.T)
        try:
            claimed = Proof.from_frame(frame).proof
        except ProtocolError as e:
            raise Refused("protocol", str(e)) from None
        key, transcript = self.auth.key, self._transcript
        try:
            check_proof(key, "client", transcript, claimed)
        except LinkAuthError:
            raise Refused("auth", DIALER_NO_PROOF) from None
        keys = link_keys(key, "server", transcript)
        self.cipher = LinkCipher(FrameSealer(keys.send), FrameOpener(keys.receive))
