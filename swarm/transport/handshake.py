"""The hello that opens every frame connection: the one place each side establishes one.

The steps and rules are link_handshake.py's (no I/O there); here they meet sockets:

  `dial`        blocking, on the MLX thread (lane.py): a data link, a PeerConnection
  `dial_stream` asyncio, on the event loop: a StreamFrameLink for a named purpose
                ("profile", "weights", ...), e.g. discovery's profile fetch
  `answer`      asyncio, on the event loop (listener.py): whatever a peer opened

Each ends in a link that carries the peer's node id, proved by the swarm secret when
there is one, and seals every later frame with the keys of this handshake. Rejection
kinds: "version", "swarm", "protocol" (not a hello at all), "node" (the address
answered as another node than the one meant), "duplicate" (the two nodes are
connecting to each other at this moment; links.py keeps one), "auth" (one side has
a swarm secret and the other none, or another one), "purpose" (no such service).

Why a handshake failed is logged once per address and reason, by each node
(`note_refusal`, LinkAuth.refusals): a stranger that knocks every second leaves one
line, not thousands.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass
from typing import Callable

from .connection import PeerConnection
from .errors import ConnectionClosed, HandshakeRejected, ProtocolError
from .frames import Frame, FrameParser, read_frame
from .link_handshake import AnswererHandshake, DialerHandshake, LinkAuth, LinkCipher, Refused, frame_bytes
from .log_limit import LogLimiter
from .handshake_messages import Admitted, Rejection
from .sealed_frames import SealedFrameParser, read_sealed_frame, seal_frame
from .stream_link import StreamFrameLink

log = logging.getLogger("swarm.transport")

HANDSHAKE_TIMEOUT = 5.0
_MAX_HELLO_PAYLOAD = 0  # a hello carries no payload; anything bigger is not one

Admit = Callable[[str, str], Rejection | None]  # (peer, purpose) -> a refusal, or None: the link is taken
Withdraw = Callable[[str, str], None]  # a link that was taken is not used after all


def note_refusal(where: str, exc: HandshakeRejected, dialed: bool, refusals: LogLimiter) -> None:
    """Log why a handshake failed: once per address and kind at WARNING (later ones at DEBUG)."""
    if exc.kind == "duplicate":  # two nodes dialing each other at once: links.py keeps one, nothing is wrong
        log.info("%s a second connection %s %s: %s", "refused by" if dialed else "refused", "to" if dialed
                  else "from", where, exc.message)
        return
    host = where.rpartition(":")[0] if ":" in where else where
    what = f"our hello to {where} failed" if dialed else f"refused a hello from {where}"
    refusals.once((host, exc.kind, exc.message, dialed), "%s (%s): %s", what, exc.kind, exc.message)


# -- outgoing, blocking: the data lane (MLX thread) ------------------------------------------------
def dial(address: tuple[str, int], auth: LinkAuth, expected_peer: str, timeout: float, max_payload: int,
         on_close: Callable[[], None] | None = None) -> PeerConnection:
    """Connect to `expected_peer` at `address` and complete the handshake, all within `timeout`.

    Raises OSError (unreachable, timed out) or ProtocolError (HandshakeRejected when either
    side refused: its kind says why)."""
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except TimeoutError:
        raise TimeoutError(f"no connection within {timeout} s") from None
    where = f"{address[0]}:{address[1]}"
    steps = DialerHandshake(auth, "data", expected_peer)
    try:
        sock.sendall(steps.hello())
        parser: FrameParser | SealedFrameParser = FrameParser(max_payload)
        answer = _receive_one(sock, parser, deadline, "hello")
        try:
            proof = steps.on_answer(answer)
        except Refused as refusal:
            sock.sendall(refusal.reply)
            raise
        sealer = None
        if steps.cipher is not None:  # with a secret: our proof, then its sealed verdict
            sock.sendall(proof)
            plain_rest, parser = parser.take_rest(), SealedFrameParser(steps.cipher.opener, max_payload)
            steps.on_verdict(_receive_one(sock, parser, deadline, "verdict", plain_rest))
            sealer = steps.cipher.sealer
        # Frames may follow at once (the connection is used both ways): they stay with the parser.
        return PeerConnection(sock, steps.peer, where, dialed=True, parser=parser, ready=parser.feed(b""),
                              sealer=sealer, on_close=on_close)
    except HandshakeRejected as exc:
        note_refusal(where, exc, dialed=True, refusals=auth.refusals)
        sock.close()
        raise
    except BaseException:
        sock.close()
        raise


def _receive_one(sock: socket.socket, parser: FrameParser | SealedFrameParser, deadline: float, what: str,
                 already: bytes = b"") -> Frame:
    """The next frame (from `already` read bytes first), leaving whatever came behind it in the parser."""
    frames = parser.feed(already, max_frames=1)
    while not frames:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise TimeoutError(f"no {what} within the handshake's time") from None
        if not data:
            raise ConnectionClosed(f"closed during the handshake (waiting for its {what})")
        frames = parser.feed(data, max_frames=1)
    if memoryview(frames[0].payload).nbytes > _MAX_HELLO_PAYLOAD:
        raise HandshakeRejected("protocol", "a handshake frame with a payload")
    return frames[0]


# -- outgoing, asyncio: links for a purpose (event loop) --------------------------------------------
async def dial_stream(address: tuple[str, int], auth: LinkAuth, purpose: str, *, expected_peer: str | None = None,
                      timeout: float = HANDSHAKE_TIMEOUT, max_payload: int,
                      connected: Callable[[], None] | None = None) -> StreamFrameLink:
    """A link to the node at `address` for `purpose`, authenticated (and sealed) as the lane's are.
    `connected`: called once the connection is made (before the handshake)."""
    where = f"{address[0]}:{address[1]}"
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), timeout)
    if connected is not None:
        connected()
    try:
        steps = DialerHandshake(auth, purpose, expected_peer)
        writer.write(steps.hello())
        answer = await asyncio.wait_for(read_frame(reader, _MAX_HELLO_PAYLOAD), timeout)
        try:
            proof = steps.on_answer(answer)
        except Refused as refusal:
            writer.write(refusal.reply)
            raise
        cipher = steps.cipher
        if cipher is not None:
            writer.write(proof)
            steps.on_verdict(await asyncio.wait_for(read_sealed_frame(reader, cipher.opener, _MAX_HELLO_PAYLOAD),
                                                    timeout))
        return StreamFrameLink(steps.peer, reader, writer, max_payload, cipher=cipher)
    except HandshakeRejected as exc:
        note_refusal(where, exc, dialed=True, refusals=auth.refusals)
        writer.close()
        raise
    except asyncio.TimeoutError:
        writer.close()
        raise TimeoutError(f"{where}: no handshake within {timeout} s") from None
    except BaseException:
        writer.close()
        raise


# -- incoming, asyncio (event loop) ---------------------------------------------------------------
@dataclass
class Answered:
    peer: str
    purpose: str
    cipher: LinkCipher | None


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, auth: LinkAuth,
                 purposes: frozenset[str] | set[str], admit: Admit, withdraw: Withdraw, where: str,
                 timeout: float = HANDSHAKE_TIMEOUT) -> Answered:
    """After MAGIC was read: check the dialer's hello (and proof), ask `admit` whether the link may be
    taken, answer. All within `timeout` in all. Raises ProtocolError (HandshakeRejected after telling
    the dialer why, when it can be told)."""
    steps = AnswererHandshake(auth, purposes)
    deadline = asyncio.get_running_loop().time() + timeout
    admitted = False

    async def within(coro):
        try:
            return await asyncio.wait_for(coro, max(0.001, deadline - asyncio.get_running_loop().time()))
        except asyncio.TimeoutError as exc:
            raise ProtocolError(f"no complete handshake within {timeout} s") from exc

    try:
        try:
            reply = steps.on_hello(await within(read_frame(reader, _MAX_HELLO_PAYLOAD)))
            peer, purpose = steps.hello.node_id, steps.hello.purpose
            if not steps.sealed:  # nothing to prove: take the link before saying yes
                _refuse_unless_admitted(admit(peer, purpose))
                admitted = True
            writer.write(reply)
            if steps.sealed:
                steps.on_proof(await within(read_frame(reader, _MAX_HELLO_PAYLOAD)))
                refusal = admit(peer, purpose)
                sealer = steps.cipher.sealer
                if refusal is not None:
                    writer.writelines(seal_frame(sealer, *refusal.to_frame()))
                    await within(writer.drain())
                    raise HandshakeRejected(refusal.kind, refusal.message)
                admitted = True
                writer.writelines(seal_frame(sealer, *Admitted().to_frame()))
            # All of it out before the new owner writes frames after it. A few hundred bytes: the socket
            # takes them at once, so this does not wait (nor yield to the loop, as a timeout around it would).
            await writer.drain()
        except Refused as refusal:
            try:
                writer.write(refusal.reply)
                await asyncio.wait_for(writer.drain(), 1.0)
            except (OSError, asyncio.TimeoutError):
                pass  # it stopped listening; it learns from the close
            raise
    except HandshakeRejected as exc:
        note_refusal(where, exc, dialed=False, refusals=auth.refusals)
        raise
    except BaseException:
        if admitted:
            withdraw(peer, purpose)
        raise
    return Answered(peer, purpose, steps.cipher)


def _refuse_unless_admitted(refusal: Rejection | None) -> None:
    if refusal is not None:
        raise Refused(refusal.kind, refusal.message)


def take_socket(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answered: Answered, where: str,
                max_payload: int, on_close: Callable[[], None] | None) -> PeerConnection:
    """An answered data link as a PeerConnection for the lane: a duplicate of the socket (the asyncio one
    is closed by the caller), with whatever the reader already holds."""
    writer.transport.pause_reading()
    # A dialer sends its first frame only after our answer, so this is nearly always empty;
    # asyncio has no public accessor for what its reader already holds.
    pending = bytes(reader._buffer)
    cipher = answered.cipher
    parser = SealedFrameParser(cipher.opener, max_payload) if cipher else FrameParser(max_payload)
    return PeerConnection(writer.get_extra_info("socket").dup(), answered.peer, where, dialed=False,
                          max_payload=max_payload, pending=pending, parser=parser,
                          sealer=cipher.sealer if cipher else None, on_close=on_close)


__all__ = ["HANDSHAKE_TIMEOUT", "Answered", "answer", "dial", "dial_stream", "frame_bytes", "note_refusal",
           "take_socket"]
