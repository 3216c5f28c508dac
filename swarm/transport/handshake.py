"""The hello that opens every frame connection: the one place each side establishes one.

    dialer -> listener: MAGIC, Hello(version, node_id, swarm)
    listener -> dialer: its own Hello, or a Rejection and close
    dialer:             checks the listener's Hello; if it refuses it, a Rejection is
                        the first (and last) frame the listener reads afterwards

`dial` (blocking, on the MLX thread: lane.py) and `answer` (asyncio, on the event
loop: listener.py) both end in a PeerConnection that carries the peer's node id.
The listener validates before answering, so a refused dialer learns why. Rejection
kinds: "version", "swarm", "protocol" (not a hello at all), "node" (the address
answered as another node than the one meant: reused by another node), "duplicate"
(the two nodes are connecting to each other at this moment; links.py keeps one).

Issue 19's mutual challenge-response belongs here: both functions, and nothing else,
decide that a peer is who it says.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING

from discovery.profile import COMPATIBLE_PROTOCOL_VERSIONS, PROTOCOL_VERSION

from .connection import PeerConnection
from .errors import ConnectionClosed, HandshakeRejected, ProtocolError
from .frames import MAGIC, Frame, FrameParser, encode_frame, read_frame
from .messages import Hello, Rejection

if TYPE_CHECKING:
    from .links import PeerLinks

HANDSHAKE_TIMEOUT = 5.0
_MAX_HELLO_PAYLOAD = 0  # a hello carries no payload; anything bigger is not one


def own_hello(node_id: str, swarm: str) -> Hello:
    return Hello(PROTOCOL_VERSION, node_id, swarm)


def check_hello(frame: Frame, swarm: str) -> str:
    """The peer's node id from its hello; HandshakeRejected if we must not talk to it."""
    if frame.header["t"] == Rejection.T:
        refused = Rejection.from_frame(frame)
        raise HandshakeRejected(refused.kind, f"peer says: {refused.message}")
    if frame.header["t"] != Hello.T:
        raise HandshakeRejected("protocol", f"expected a hello frame, got {frame.header['t']!r}")
    try:
        hello = Hello.from_frame(frame)
    except ProtocolError as e:
        raise HandshakeRejected("protocol", str(e)) from None
    if hello.version not in COMPATIBLE_PROTOCOL_VERSIONS:
        raise HandshakeRejected("version", f"protocol version {hello.version!r} not in "
                                           f"{sorted(COMPATIBLE_PROTOCOL_VERSIONS)}")
    if hello.swarm != swarm:
        raise HandshakeRejected("swarm", f"swarm {hello.swarm!r} is not {swarm!r}")
    return hello.node_id


def frame_bytes(message: Hello | Rejection) -> bytes:
    return b"".join(bytes(p) for p in encode_frame(*message.to_frame()))


# -- outgoing: connect + hello (blocking; the MLX thread) -------------------------------------
def dial(address: tuple[str, int], node_id: str, swarm: str, expected_peer: str, timeout: float,
         max_payload: int) -> PeerConnection:
    """Connect to `expected_peer` at `address` and exchange hellos, all within `timeout`.

    Raises OSError (unreachable, timed out) or ProtocolError (HandshakeRejected when either
    side refused: its kind says why)."""
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except TimeoutError:
        raise TimeoutError(f"no connection within {timeout} s") from None
    where = f"{address[0]}:{address[1]}"
    try:
        sock.sendall(MAGIC + frame_bytes(own_hello(node_id, swarm)))
        # The peer may write frames right behind its hello (the connection is used both ways at
        # once): whatever comes with it stays in the parser for the connection to read.
        parser, frames = FrameParser(max_payload), []
        while not frames:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                data = sock.recv(4096)
            except TimeoutError:
                raise TimeoutError(f"no hello within {timeout} s") from None
            if not data:
                raise ConnectionClosed("closed during the hello")
            frames = parser.feed(data)
        if memoryview(frames[0].payload).nbytes > _MAX_HELLO_PAYLOAD:
            raise HandshakeRejected("protocol", "a hello with a payload")
        peer = check_hello(frames[0], swarm)
        if peer != expected_peer:
            refusal = HandshakeRejected("node", f"address answered as node {peer!r}, not {expected_peer!r}")
            sock.sendall(frame_bytes(Rejection(refusal.kind, refusal.message)))
            raise refusal
        return PeerConnection(sock, peer, where, dialed=True, parser=parser, ready=frames[1:])
    except BaseException:
        sock.close()
        raise


# -- incoming: hello answered (asyncio; the event loop) -----------------------------------------
async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, node_id: str, swarm: str,
                 links: PeerLinks, where: str, max_payload: int, timeout: float = HANDSHAKE_TIMEOUT
                 ) -> PeerConnection:
    """After MAGIC was read: check the dialer's hello, ask `links` whether this connection may be
    the one to that peer, answer, and hand back the connection (`links.arrived` takes it next).

    The returned connection owns a duplicate of the socket (the asyncio one is closed by the
    caller). Raises ProtocolError (HandshakeRejected after telling the dialer why)."""
    try:
        frame = await asyncio.wait_for(read_frame(reader, _MAX_HELLO_PAYLOAD), timeout)
    except asyncio.TimeoutError as exc:
        raise ProtocolError(f"no hello within {timeout} s") from exc
    try:
        peer = check_hello(frame, swarm)
        refusal = links.admit(peer)
    except HandshakeRejected as rejection:
        refusal = Rejection(rejection.kind, rejection.message)
    if refusal is not None:
        try:
            writer.write(frame_bytes(refusal))
            await asyncio.wait_for(writer.drain(), 1.0)
        except (OSError, asyncio.TimeoutError):
            pass  # it stopped listening; it learns from the close
        raise HandshakeRejected(refusal.kind, refusal.message)
    try:
        writer.write(frame_bytes(own_hello(node_id, swarm)))
        await writer.drain()  # all of it out before the new owner writes frames after it
        writer.transport.pause_reading()
        # A dialer sends its first frame only after our hello, so this is nearly always empty;
        # asyncio has no public accessor for what its reader already holds.
        pending = bytes(reader._buffer)
        return PeerConnection(writer.get_extra_info("socket").dup(), peer, where, dialed=False,
                              max_payload=max_payload, pending=pending)
    except BaseException:
        links.withdraw(peer)
        raise
