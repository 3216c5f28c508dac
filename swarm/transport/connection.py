"""One established frame connection to a peer: the socket, who is at the other end, and
the connection's only frame reader and frame writer.

Made in exactly two places (handshake.py): `dial` when we open it, `answer` when the
peer did. Either way the hello has named the peer, so every frame read here comes
from `peer`. With a swarm secret the handshake hands over the link's sealer and a
sealed parser (sealed_frames.py): `write_frame` seals and `read_frames` opens, here
and nowhere else; a frame that does not open is a ProtocolError like any garbage.

The socket is non-blocking: reads take what has arrived, a write waits for room at
most `send_timeout` (a peer that stops reading must not hold our thread for longer).
Only the MLX thread reads and writes once a connection is in use (lane.py);
`peer_gone` may be asked from any thread.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from typing import Callable

from .errors import ProtocolError
from .frames import DEFAULT_MAX_PAYLOAD_BYTES, Frame, FrameParser, encode_frame
from .link_crypto import FrameSealer
from .sealed_frames import SealedFrameParser, seal_frame

RECV_BYTES = 256 * 1024


class PeerConnection:
    def __init__(self, sock: socket.socket, peer: str, where: str, dialed: bool,
                 max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES, *, pending: bytes = b"",
                 parser: FrameParser | SealedFrameParser | None = None, ready: list[Frame] | None = None,
                 sealer: FrameSealer | None = None, on_close: Callable[[], None] | None = None) -> None:
        """`pending`, `parser` and `ready`: what the handshake read past the hello (bytes not parsed
        yet, the parser holding a partial frame, whole frames) comes first. A sealed link has a
        `sealer` and a SealedFrameParser. `on_close` runs once when the connection is closed."""
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):  # one decode step now, not after Nagle's 40 ms
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.peer = peer  # the node id the hello proved
        self.where = where  # "host:port" of the other end, for log lines
        self.dialed = dialed  # we opened it (decides which of two simultaneous connections stays)
        self._parser = parser or FrameParser(max_payload)
        self._sealer = sealer
        self._pending, self._ready = pending, ready or []
        self._recv_buf: bytearray | None = None
        self._on_close = on_close
        self.last_active = time.monotonic()  # a frame read or written (lane.py retires idle links)
        self.retired_at: float | None = None
        self._readable = select.poll()  # asked before every write: has the peer hung up?
        self._readable.register(sock, select.POLLIN)

    def __repr__(self) -> str:
        return f"<PeerConnection {'to' if self.dialed else 'from'} {self.peer} at {self.where}>"

    # -- the frame reader -------------------------------------------------------------------
    def read_frames(self) -> list[Frame] | None:
        """The whole frames that have arrived (maybe none); None when the peer closed between frames.

        ProtocolError for garbage, or a close in the middle of a frame; OSError when the socket broke."""
        self.last_active = time.monotonic()
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
        self.last_active = time.monotonic()
        # a bad header is the caller's bug: ValueError
        pieces = (encode_frame(header, payload) if self._sealer is None
                  else seal_frame(self._sealer, header, payload, reuse=True))  # sent (or copied) below
        total = sum(memoryview(p).nbytes for p in pieces)
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

    def cork(self, on: bool) -> None:
        """Hold small writes back to send them as one segment (TCP_CORK); uncorking sends them now."""
        if self.sock.family in (socket.AF_INET, socket.AF_INET6) and hasattr(socket, "TCP_CORK"):
            try:
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1 if on else 0)
            except OSError:
                pass  # a closed socket: its writes fail on their own

    # -- state ------------------------------------------------------------------------------
    def peer_closed(self) -> bool:
        """Has the peer closed (EOF or reset) since we last read? Does not wait, consumes nothing.

        The owner's thread only (the poll object is not for two threads at once): see `peer_gone`."""
        return bool(self._readable.poll(0)) and self.peer_gone()

    def hangup(self) -> str | None:
        """After `peer_closed`: None for a clean end, or what broke (a reset)."""
        try:
            self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            return f"the peer reset the connection ({type(exc).__name__})"
        return None

    def peer_gone(self) -> bool:
        """`peer_closed` for any thread: one more system call."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    @property
    def sealed(self) -> bool:
        return self._sealer is not None

    def close(self, abort: bool = False) -> None:
        """Close the socket; `abort`: with a reset, so the peer knows the link broke (not a clean end)."""
        if abort:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            except OSError:
                pass
        self.sock.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()


_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


def _send(sock: socket.socket, pieces: list) -> int:
    try:
        return sock.sendmsg(pieces)
    except (BlockingIOError, InterruptedError):
        return 0


def _wait_writable(sock: socket.socket, timeout: float) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    return bool(poller.poll(timeout * 1000))
