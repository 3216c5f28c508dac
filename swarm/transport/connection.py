"""One established frame connection to a peer: the socket, who is at the other end, and
the connection's only frame reader and frame writer.

Made in exactly two places (handshake.py): `dial` when we open it, `answer` when the
peer did. Either way the hello has named the peer, so every frame read here comes
from `peer`. With a swarm secret the handshake hands over the link's sealer and a
sealed parser (sealed_frames.py): `write_frame` seals and `read_frames` opens, here
and nowhere else; a frame that does not open is a ProtocolError like any garbage.

The socket is non-blocking, both ways: reads take what has arrived, and a write never
waits. What the socket does not take at once waits in the connection's queue, in order,
bounded in bytes (`queue_limit`), and leaves with `flush` when the socket has room
(lane.py watches for it): a peer that reads slowly or not at all must never hold the
thread that computes for everyone else. `stalled_for` says how long bytes have waited
without the socket taking any. Only the MLX thread reads and writes once a connection
is in use (lane.py); `peer_gone` may be asked from any thread.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections import deque
from typing import Callable

from .errors import ProtocolError
from .frames import DEFAULT_MAX_PAYLOAD_BYTES, Frame, FrameParser, encode_frame
from .link_crypto import FrameSealer
from .sealed_frames import SealedFrameParser, seal_frame

RECV_BYTES = 256 * 1024
DEFAULT_QUEUE_LIMIT = 128 * 1024 * 1024  # bytes waiting for a peer before its link counts as broken
_IOV_MAX = 512  # buffers handed to one sendmsg (the kernel takes up to 1024)


class QueueFull(OSError):
    """More is waiting for the peer than the connection may hold: it does not keep up."""


class PeerConnection:
    def __init__(self, sock: socket.socket, peer: str, where: str, dialed: bool,
                 max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES, *, pending: bytes = b"",
                 parser: FrameParser | SealedFrameParser | None = None, ready: list[Frame] | None = None,
                 sealer: FrameSealer | None = None, on_close: Callable[[], None] | None = None,
                 queue_limit: int = DEFAULT_QUEUE_LIMIT) -> None:
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
        self.queue_limit = queue_limit
        self._queue: deque[memoryview] = deque()  # bytes the socket has not taken yet, in order
        self._queued = 0
        self._moved_at = 0.0  # when the socket last took bytes of the queue (or the queue began)
        self.retired_at: float | None = None
        self._readable = select.poll()  # asked before every write: has the peer hung up?
        self._readable.register(sock, select.POLLIN)

    @property
    def host(self) -> str:
        """The other end's address (the peer's address this link is on)."""
        return self.where.rpartition(":")[0]

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
    def write_frame(self, header: dict, payload: bytes | memoryview) -> bool:
        """Write one whole frame, or queue what the socket does not take now; never waits. True when
        nothing waits; False: `flush` when the socket is writable. QueueFull when the queue holds
        `queue_limit` bytes already, OSError when the socket broke: the connection is unusable, close it."""
        self.last_active = time.monotonic()
        # a bad header is the caller's bug: ValueError
        pieces = (encode_frame(header, payload) if self._sealer is None
                  else seal_frame(self._sealer, header, payload, reuse=True))  # sent (or copied) below
        total = sum(memoryview(p).nbytes for p in pieces)
        if self._queue:  # behind what waits, in order
            if self._queued + total > self.queue_limit:
                raise QueueFull(f"{self._queued} bytes wait for the peer already: it does not keep up")
            self._queue.append(memoryview(b"".join(pieces)))  # a copy: the payload and the sealer's buffer are reused
            self._queued += total
            return self.flush()
        sent = _send(self.sock, pieces)  # one sendmsg, the payload not copied: nearly always all of it
        if sent == total:
            return True
        rest = memoryview(b"".join(pieces))[sent:]
        self._queue.append(rest)
        self._queued, self._moved_at = len(rest), time.monotonic()
        return False

    def flush(self) -> bool:
        """Send as much of the queue as the socket takes now; True when nothing waits any more."""
        while self._queue:
            sent = _send(self.sock, list(self._queue)[:_IOV_MAX] if len(self._queue) > 1 else [self._queue[0]])
            if not sent:
                return False
            self._moved_at = time.monotonic()
            self._queued -= sent
            while sent:
                head = self._queue[0]
                if len(head) > sent:
                    self._queue[0] = head[sent:]
                    break
                sent -= len(head)
                self._queue.popleft()
        return True

    def flush_within(self, stall_timeout: float) -> None:
        """Send the whole queue, waiting for room as long as the peer takes bytes: TimeoutError once it
        took none for `stall_timeout` (for a sender with no selector of its own)."""
        while not self.flush():
            poller = select.poll()
            poller.register(self.sock, select.POLLOUT)
            if self.stalled_for(time.monotonic()) >= stall_timeout or not poller.poll(stall_timeout * 1000):
                raise TimeoutError(f"the peer took no data for {stall_timeout:g} s")

    @property
    def queued(self) -> int:
        """Bytes waiting for the socket to take them."""
        return self._queued

    def stalled_for(self, now: float) -> float:
        """How long bytes have waited without the socket taking any (0: nothing waits)."""
        return now - self._moved_at if self._queue else 0.0

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

