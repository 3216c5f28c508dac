"""The data lane: peer frames read and written by the MLX thread itself, with no event loop between.

A pipeline stage idles while the others compute, and on an idle machine every
thread wake-up and every cold line of asyncio costs tens to hundreds of
microseconds (benchmarks/wake_floor.py). So the thread that computes also reads
its input and writes its output: a decode step arrives, is computed and leaves
without waking another thread (benchmarks/lean_pipeline.py measures the floor).

- Incoming: the TCP transport accepts a connection and checks the hello on the
  event loop, then hands the socket over with `adopt`. Frames are parsed from
  whatever arrives (non-blocking), so a slow or stalled sender holds up nobody.
- Outgoing: `send` writes on a connection of the lane's own, opened on first use
  (connect + hello, blocking, with timeouts). A frame is written whole, so
  frames to one peer leave in order; a peer that stops reading fails the send
  after `send_timeout` (PeerUnreachable), it never blocks the thread for longer.
- Garbage on a connection closes that connection only, with one log line.

Everything here runs on the worker thread (see engine/worker.py): the lane is
not thread-safe and does not need to be.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from typing import Callable

from .errors import ConnectionClosed, HandshakeRejected, PeerUnreachable, ProtocolError
from .frames import _PREFIX, DEFAULT_MAX_PAYLOAD_BYTES, MAGIC, MAX_HEADER_BYTES, Frame, decode_header, encode_frame
from .handshake import check_hello, error_header, hello_header, raise_if_rejected

log = logging.getLogger("swarm.transport")

OnFrame = Callable[[str, Frame], None]
Watch = Callable[[socket.socket, Callable[[], None] | None], None]  # register (callback) or forget (None)
RECV_BYTES = 256 * 1024
DEFAULT_SEND_TIMEOUT = 10.0


class FrameParser:
    """Bytes in, whole frames out; ProtocolError for anything malformed or oversized.

    Lengths are checked as soon as a frame's 8-byte prefix is in, so a lying
    prefix costs no memory."""

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
        self.max_payload = max_payload
        self._buf = bytearray()

    @property
    def mid_frame(self) -> bool:
        return bool(self._buf)

    def feed(self, data: bytes | memoryview) -> list[Frame]:
        self._buf += data
        frames = []
        while len(self._buf) >= _PREFIX.size:
            header_len, payload_len = _PREFIX.unpack_from(self._buf)
            if header_len > MAX_HEADER_BYTES:
                raise ProtocolError(f"frame header of {header_len} bytes (max {MAX_HEADER_BYTES})")
            if payload_len > self.max_payload:
                raise ProtocolError(f"frame payload of {payload_len} bytes (max {self.max_payload})")
            end = _PREFIX.size + header_len + payload_len
            if len(self._buf) < end:
                break
            header = decode_header(bytes(self._buf[_PREFIX.size:_PREFIX.size + header_len]))
            payload = bytes(self._buf[_PREFIX.size + header_len:end]) if payload_len else b""
            del self._buf[:end]
            frames.append(Frame(header, payload))
        return frames


class _Connection:
    def __init__(self, sock: socket.socket, peer: str, where: str, outgoing: bool, max_payload: int) -> None:
        self.sock, self.peer, self.where, self.outgoing = sock, peer, where, outgoing
        self.parser = FrameParser(max_payload)
        self._recv_buf: bytearray | None = None

    def recv(self) -> memoryview:
        """What arrived, read into a buffer kept for the connection (no large allocation per read)."""
        if self._recv_buf is None:
            self._recv_buf = bytearray(RECV_BYTES)
        n = self.sock.recv_into(self._recv_buf)
        return memoryview(self._recv_buf)[:n]


class DataLane:
    def __init__(self, node_id: str, swarm: str, watch: Watch, on_frame: OnFrame,
                 address_of: Callable[[str], tuple[str, int] | None], *,
                 max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES, connect_timeout: float = 2.0,
                 send_timeout: float = DEFAULT_SEND_TIMEOUT) -> None:
        self.node_id, self.swarm = node_id, swarm
        self._watch, self._on_frame, self._address_of = watch, on_frame, address_of
        self.max_payload = max_payload
        self.connect_timeout, self.send_timeout = connect_timeout, send_timeout
        self._incoming: set[_Connection] = set()
        self._outgoing: dict[str, _Connection] = {}

    # -- receiving --------------------------------------------------------
    def adopt(self, sock: socket.socket, peer: str, where: str, pending: bytes = b"") -> None:
        """Read frames from a handshaken connection from now on (it is ours to close).

        `pending`: bytes the transport had already read past the hello."""
        sock.setblocking(False)
        conn = _Connection(sock, peer, where, outgoing=False, max_payload=self.max_payload)
        self._incoming.add(conn)
        self._watch(sock, lambda: self._readable(conn))
        if pending:
            self._deliver(conn, pending)

    def _readable(self, conn: _Connection) -> None:
        try:
            data = conn.recv()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(conn, f"{exc}")
            return
        if not data:
            self._close(conn, "closed mid-frame" if conn.parser.mid_frame else None)
            return
        self._deliver(conn, data)

    def _deliver(self, conn: _Connection, data: bytes) -> None:
        try:
            frames = conn.parser.feed(data)
        except ProtocolError as exc:
            self._close(conn, str(exc))
            return
        for frame in frames:
            if frame.header["t"] == "error" and not conn.outgoing:  # the peer rejected our hello
                self._close(conn, f"peer says: {frame.header.get('message')}")
                return
            self._on_frame(conn.peer, frame)

    # -- sending ----------------------------------------------------------
    def send(self, node_id: str, header: dict, payload: bytes | memoryview = b"") -> None:
        """Write one frame to `node_id`, connecting on first use; PeerUnreachable if that fails."""
        pieces = encode_frame(header, payload)  # a bad header is the caller's bug: ValueError
        conn = self._connection(node_id)
        try:
            _send_all(conn.sock, pieces)
        except OSError as exc:  # incl. the send timeout
            self._close(conn, None)
            raise PeerUnreachable(node_id, f"connection broke: {type(exc).__name__}: {exc}") from exc

    def drop(self, node_id: str) -> None:
        conn = self._outgoing.get(node_id)
        if conn is not None:
            self._close(conn, None)

    def close(self) -> None:
        for conn in [*self._incoming, *self._outgoing.values()]:
            self._close(conn, None)

    def _connection(self, node_id: str) -> _Connection:
        address = self._address_of(node_id)
        if address is None:
            raise PeerUnreachable(node_id, "not in this node's view of the swarm")
        conn = self._outgoing.get(node_id)
        if conn is not None and (conn.where != _where(address) or _peer_closed(conn.sock)):
            self._close(conn, None)  # the peer restarted or moved: a write would vanish into a dead socket
            conn = None
        if conn is None:
            conn = self._open(node_id, address)
        return conn

    def _open(self, node_id: str, address: tuple[str, int]) -> _Connection:
        try:
            sock = socket.create_connection(address, timeout=self.connect_timeout)
        except OSError as exc:
            raise PeerUnreachable(node_id, f"{_where(address)}: {type(exc).__name__}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Connection(sock, node_id, _where(address), outgoing=True, max_payload=0)
        try:
            self._handshake(conn)
        except (OSError, ProtocolError) as exc:
            sock.close()
            raise PeerUnreachable(node_id, f"{conn.where}: {type(exc).__name__}: {exc}") from None
        sock.settimeout(self.send_timeout)
        conn.parser.max_payload = self.max_payload  # the hello carried none; later frames may
        self._outgoing[node_id] = conn
        # Read it too: to see the peer close (so the next send reconnects) and to
        # deliver anything it does send, like any other frame.
        self._watch(sock, lambda: self._readable(conn))
        return conn

    def _handshake(self, conn: _Connection) -> None:
        """Our hello, theirs back; within the connect timeout, which covers both (as on the event loop)."""
        sock, deadline = conn.sock, time.monotonic() + self.connect_timeout
        sock.sendall(MAGIC + b"".join(encode_frame(hello_header(self.node_id, self.swarm))))
        frames: list[Frame] = []
        while not frames:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            data = sock.recv(4096)
            if not data:
                raise ConnectionClosed("closed during the hello")
            frames = conn.parser.feed(data)
        raise_if_rejected(frames[0])
        peer = check_hello(frames[0], self.swarm)
        if peer != conn.peer:
            rejection = HandshakeRejected("node", f"address answered as node {peer!r}, not {conn.peer!r}")
            sock.sendall(b"".join(encode_frame(error_header(rejection.kind, rejection.message))))
            raise rejection

    def _close(self, conn: _Connection, problem: str | None) -> None:
        if problem:
            log.warning("closing peer connection %s %s: %s", "to" if conn.outgoing else "from", conn.where, problem)
        self._incoming.discard(conn)
        if self._outgoing.get(conn.peer) is conn and conn.outgoing:
            del self._outgoing[conn.peer]
        try:
            self._watch(conn.sock, None)
        except (KeyError, ValueError):
            pass  # never registered, or already closed
        conn.sock.close()


def _where(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def _peer_closed(sock: socket.socket) -> bool:
    """Has the peer closed (EOF or reset) since we last looked? Does not wait."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""  # readable, so this returns at once
    except OSError:
        return True


def _send_all(sock: socket.socket, pieces: list) -> None:
    """One sendmsg, without copying the payload; the rest, if the socket took only part (full buffer)."""
    sent = sock.sendmsg(pieces)
    if sent < sum(memoryview(p).nbytes for p in pieces):
        sock.sendall(b"".join(pieces)[sent:])
