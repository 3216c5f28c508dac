"""One established frame connection to a peer: the socket, who is at the other end, and
the connection's only frame reader and frame writer.

Made in exactly two places (handshake.py): `dial` when we open it, `answer` when the
peer did. Either way the hello has named the peer, so every frame read here comes
from `peer`. Sealing and opening frames (encryption, sequence numbers) belongs in
`write_frame` and `read_frames` and nowhere else.

The socket is non-blocking: reads take what has arrived, a write waits for room at
most `send_timeout` (a peer that stops reading must not hold our thread for longer).
Only the MLX thread reads and writes once a connection is in use (lane.py);
`peer_gone` may be asked from any thread.
"""

from __future__ import annotations

import select
import socket
import time

from .errors import ProtocolError
from .frames import DEFAULT_MAX_PAYLOAD_BYTES, Frame, FrameParser, encode_frame

RECV_BYTES = 256 * 1024


class PeerConnection:
    def __init__(self, sock: socket.socket, peer: str, where: str, dialed: bool,
                 max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES, *, pending: bytes = b"",
                 parser: FrameParser | None = None, ready: list[Frame] | None = None) -> None:
        """`pending`, or `parser` and `ready`: what the handshake read past the hello (bytes not
        parsed yet; or the parser holding a partial frame, and whole frames) comes first."""
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):  # one decode step now, not after Nagle's 40 ms
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.peer = peer  # the node id the hello proved
        self.where = where  # "host:port" of the other end, for log lines
        self.dialed = dialed  # we opened it (decides which of two simultaneous connections stays)
        self._parser = parser or FrameParser(max_payload)
        self._pending, self._ready = pending, ready or []
        self._recv_buf: bytearray | None = None
        self._readable = select.poll()  # asked before every write: has the peer hung up?
        self._readable.register(sock, select.POLLIN)

    def __repr__(self) -> str:
        return f"<PeerConnection {'to' if self.dialed else 'from'} {self.peer} at {self.where}>"

    # -- the frame reader -------------------------------------------------------------------
    def read_frames(self) -> list[Frame] | None:
        """The whole frames that have arrived (maybe none); None when the peer closed between frames.

        ProtocolError for garbage, or a close in the middle of a frame; OSError when the socket broke."""
        if self.has_pending:
            frames, self._ready = self._ready, []
            if self._pending:
                data, self._pending = self._pending, b""
                frames += self._parser.feed(data)
            return frames
        if self._recv_buf is None:  # kept per connection: no large allocation per read
            self._recv_buf = bytearray(RECV_BYTES)
        try:
            n = self.sock.recv_into(self._recv_buf)
        except (BlockingIOError, InterruptedError):
            return []
        if n == 0:
            if self._parser.mid_frame:
                raise ProtocolError("closed in the middle of a frame")
            return None
        return self._parser.feed(memoryview(self._recv_buf)[:n])

    @property
    def has_pending(self) -> bool:
        return bool(self._pending or self._ready)

    # -- the frame writer -------------------------------------------------------------------
    def write_frame(self, header: dict, payload: bytes | memoryview, timeout: float) -> None:
        """Write one whole frame; OSError (TimeoutError included) if it cannot within `timeout`.

        A frame is written whole or the connection is unusable after it: close it then."""
        pieces = encode_frame(header, payload)  # a bad header is the caller's bug: ValueError
        total = len(pieces[0]) + memoryview(payload).nbytes
        sent = _send(self.sock, pieces)  # one sendmsg, the payload not copied: nearly always all of it
        if sent == total:
            return
        rest = memoryview(b"".join(pieces))[sent:]
        deadline = time.monotonic() + timeout
        while rest:
            left = deadline - time.monotonic()
            if left <= 0 or not _wait_writable(self.sock, left):
                raise TimeoutError(f"the peer took no data for {timeout:.0f} s")
            rest = rest[_send(self.sock, [rest]):]

    # -- state ------------------------------------------------------------------------------
    def peer_closed(self) -> bool:
        """Has the peer closed (EOF or reset) since we last read? Does not wait, consumes nothing.

        The owner's thread only (the poll object is not for two threads at once): see `peer_gone`."""
        return bool(self._readable.poll(0)) and self.peer_gone()

    def peer_gone(self) -> bool:
        """`peer_closed` for any thread: one more system call."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()


def _send(sock: socket.socket, pieces: list) -> int:
    try:
        return sock.sendmsg(pieces)
    except (BlockingIOError, InterruptedError):
        return 0


def _wait_writable(sock: socket.socket, timeout: float) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    return bool(poller.poll(timeout * 1000))
