"""A peer link taken off the event loop: the same frames over a blocking socket, on one worker thread.

For bulk transfers (weights), where asyncio's stream path was the cost: every 16 MiB
frame copied into the StreamReader's buffer, out of it, and on the sending side joined,
buffered and moved down the buffer again after each send.
Here a frame's payload goes from the file to the socket by sendfile (an open link) or
through one seal (a sealed one), and arrives with `recv_into` straight into a buffer the
caller owns.

    thread_link = await stream_link.detach(timeout)   # the event loop lets go of the socket
    await run_on_own_thread(thread_link, work, thread_link, ...)   # work() uses it, on its thread

The wire format is the stream link's (frames.py, sealed_frames.py): a peer cannot tell
the two apart. Every read and write waits at most `timeout` (a peer that stops sending
or reading mid-frame cannot hold the thread); `abort()`, from any thread, wakes a thread
blocked on the link. Only the one worker thread reads and writes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
from typing import Callable, Iterator, TypeVar

from .errors import ConnectionClosed, ProtocolError
from .frames import PREFIX, Frame, check_lengths, decode_header, pack_header
from .link_crypto import PIECE_SPARE, TAG_BYTES, LinkAuthError
from .sealed_frames import JOIN_MAX_PAYLOAD, check_sealed_lengths, open_body, seal_frame, seal_frame_head

T = TypeVar("T")
# Left to the kernel's autotuning: setting SO_RCVBUF turns it off, and above net.core.rmem_max (208 KiB
# by default) asks for less than autotuning gives (measured: no gain on loopback here).
SOCKET_BUFFER_BYTES: int | None = None


class ThreadFrameLink:
    def __init__(self, peer: str, sock: socket.socket, max_payload: int, *, cipher=None, pending: bytes = b"",
                 timeout: float = 30.0) -> None:
        """`sock`: a connected socket this link now owns; `pending`: bytes already read from it."""
        self.peer, self.max_payload, self._cipher, self.timeout = peer, max_payload, cipher, timeout
        # Blocking, with the kernel's own timeouts: sendfile then sends a whole chunk in one call and a read
        # is one call, not a poll before each (Python's settimeout): a quarter less of the holder's CPU per GB.
        # (O_NONBLOCK is shared with the asyncio socket this was duplicated from, which no longer reads.)
        sock.setblocking(True)
        whole, part = divmod(max(timeout, 0.001), 1.0)  # (0 would be no timeout at all)
        for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
            sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", int(whole), int(part * 1e6)))
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request must not wait for an ACK
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF) if SOCKET_BUFFER_BYTES else ():
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        self.sock = sock
        self._pending = memoryview(pending)
        self._sealed_scratch = bytearray(0)  # a sealed link's large payloads, as they travel (sealed)
        # a frame whose header was read: its prefix, the payload's bytes still to read, or its payload already
        # opened (a small sealed frame's header and payload are sealed together, so both were read at once)
        self._next: tuple[bytes, int, memoryview | None] | None = None

    @property
    def sealed(self) -> bool:
        return self._cipher is not None

    # -- sending ----------------------------------------------------------------------------------
    def send(self, header: dict, payload: bytes | memoryview = b"") -> None:
        if self._cipher is None:
            packed = pack_header(header)
            n = memoryview(payload).nbytes
            self._sendall(PREFIX.pack(len(packed), n) + packed)
            if n:
                self._sendall(payload)
        else:
            n = memoryview(payload).nbytes
            for piece in seal_frame(self._cipher.sealer, header, payload,
                                    into=self._scratch(n + TAG_BYTES) if n > JOIN_MAX_PAYLOAD else None):
                self._sendall(piece)

    def _scratch(self, n: int) -> bytearray:
        """The link's buffer for a sealed payload (this thread's only), at least `n` bytes."""
        if len(self._sealed_scratch) < n:
            self._sealed_scratch = bytearray(n)
        return self._sealed_scratch

    def _sendall(self, data: bytes | memoryview) -> None:
        try:
            self.sock.sendall(data)
        except BlockingIOError:
            raise TimeoutError(f"{self.peer} took nothing for {self.timeout:g} s") from None

    def send_file(self, header: dict, file, offset: int, length: int, buffer: bytearray) -> None:
        """A frame whose payload is `length` bytes of `file` at `offset`: sendfile on an open link; on a
        sealed one read through `buffer` (a small payload whole, so at least JOIN_MAX_PAYLOAD bytes) and
        sealed a piece of its size at a time. OSError if the file ends early."""
        if self._cipher is not None and (len(buffer) < min(length, JOIN_MAX_PAYLOAD) or length and not buffer):
            raise ValueError(f"a buffer of {len(buffer)} bytes cannot carry a sealed payload of {length}")
        if self._cipher is not None and length <= JOIN_MAX_PAYLOAD:
            self.send(header, self._pread(file, memoryview(buffer)[:length], offset))
            return
        if self._cipher is not None:
            head, seal = seal_frame_head(self._cipher.sealer, header, length)
            self._sendall(head)
            piece, out = memoryview(buffer), self._scratch(len(buffer) + PIECE_SPARE)
            for at in range(0, length, len(piece)):
                plain = self._pread(file, piece[:min(len(piece), length - at)], offset + at)
                self._sendall(seal.update_into(plain, out))
            self._sendall(seal.finish())
            return
        packed = pack_header(header)
        self._sendall(PREFIX.pack(len(packed), length) + packed)
        sent = 0
        while sent < length:
            try:
                n = os.sendfile(self.sock.fileno(), file.fileno(), offset + sent, length - sent)
            except BlockingIOError:
                raise TimeoutError(f"{self.peer} took nothing for {self.timeout:g} s") from None
            if not n:
                raise OSError(f"{file.name} ends before byte {offset + length}")  # the peer sees a frame cut short
            sent += n

    @staticmethod
    def _pread(file, view: memoryview, offset: int) -> memoryview:
        if os.preadv(file.fileno(), [view], offset) != len(view):
            raise OSError(f"{file.name} ends before byte {offset + len(view)}")
        return view

    # -- receiving --------------------------------------------------------------------------------
    def receive(self) -> Frame:
        """The next frame, payload and all (for small frames); ConnectionClosed at a clean end."""
        header, n = self.receive_header()
        payload = self.receive_payload_into(bytearray(n))
        return Frame(header, bytes(payload) if n else b"")

    def receive_header(self) -> tuple[dict, int]:
        """The next frame's header and how many payload bytes it carries (before they are read)."""
        if self._next is not None:
            raise RuntimeError("the previous frame's payload was not read")
        prefix = self._read_exactly(PREFIX.size, between_frames=True)
        if self._cipher is None:
            header_len, payload_len = PREFIX.unpack(prefix)
            check_lengths(header_len, payload_len, self.max_payload)
            header = decode_header(self._read_exactly(header_len))
            self._next = (prefix, payload_len, None)
            return header, payload_len
        header_len, payload_len = PREFIX.unpack(prefix)
        check_sealed_lengths(header_len, payload_len, self.max_payload)
        if payload_len <= JOIN_MAX_PAYLOAD:
            frame = open_body(self._cipher.opener, prefix, self._read_exactly(header_len + payload_len), header_len,
                              payload_len)
            self._next = (prefix, 0, memoryview(frame.payload))
            return frame.header, payload_len
        header = decode_header(self._open(prefix, self._read_exactly(header_len)))
        self._next = (prefix, payload_len, None)
        return header, payload_len - TAG_BYTES

    def receive_payload_into(self, buffer: bytearray) -> memoryview | bytes:
        """The payload `receive_header` announced, in `buffer`: a view of it, no copy (sealed: read into
        the link's own buffer and opened into `buffer`; a small frame's was opened with its header)."""
        prefix, n, opened = self._next
        self._next = None
        if opened is not None:
            return opened
        plain = n - TAG_BYTES if self._cipher is not None and n else n
        if plain > len(buffer):
            raise ProtocolError(f"a payload of {plain} bytes does not fit a buffer of {len(buffer)}")
        if self._cipher is None or not n:
            view = memoryview(buffer)[:n]
            self._read_into(view)
            return view
        sealed = memoryview(self._scratch(n))[:n]
        self._read_into(sealed)
        return self._open(prefix, sealed, memoryview(buffer)[:plain])

    def receive_payload_in_pieces(self, piece: bytearray) -> Iterator[memoryview]:
        """The payload `receive_header` announced, piece by piece: each a view of `piece`, refilled with the
        next bytes once the caller asks for them (so it is done with the one before). On a sealed link each
        piece is opened as it comes and is not authentic until the iteration ends without error (a
        ProtocolError at its end if the tag does not check): keep nothing of it before."""
        prefix, n, opened = self._next
        self._next = None
        if opened is not None:  # a small sealed frame's payload, opened with its header
            return iter([opened])
        if self._cipher is None:
            return self._pieces(memoryview(piece), n)
        return self._opened_pieces(prefix, memoryview(piece), n - TAG_BYTES)

    def _pieces(self, piece: memoryview, left: int) -> Iterator[memoryview]:
        while left:
            view = piece[:min(len(piece), left)]
            self._read_into(view)
            left -= len(view)
            yield view

    def _opened_pieces(self, prefix: bytes, piece: memoryview, left: int) -> Iterator[memoryview]:
        opening = self._cipher.opener.open_in_pieces(prefix)
        size = len(piece) - PIECE_SPARE
        sealed = memoryview(self._scratch(size))
        while left:
            view = sealed[:min(size, left)]
            self._read_into(view)
            left -= len(view)
            yield opening.update_into(view, piece)
        try:
            opening.finish(self._read_exactly(TAG_BYTES))
        except LinkAuthError as e:
            raise ProtocolError(str(e)) from None

    def _open(self, prefix: bytes, sealed, into: memoryview | None = None) -> bytes | memoryview:
        """The opened bytes (into `into`, if given); ProtocolError if they do not open."""
        try:
            if into is None:
                return self._cipher.opener.open(prefix, sealed)
            return self._cipher.opener.open_into(prefix, sealed, into)
        except LinkAuthError as e:
            raise ProtocolError(str(e)) from None

    def _read_exactly(self, n: int, between_frames: bool = False) -> bytes:
        buf = bytearray(n)
        self._read_into(memoryview(buf), between_frames)
        return bytes(buf)

    def _read_into(self, view: memoryview, between_frames: bool = False) -> None:
        got = 0
        if self._pending:
            got = min(len(self._pending), len(view))
            view[:got] = self._pending[:got]
            self._pending = self._pending[got:]
        while got < len(view):
            try:
                n = self.sock.recv_into(view[got:], 0, socket.MSG_WAITALL)  # one wakeup for a whole chunk
            except BlockingIOError:
                raise TimeoutError(f"nothing from {self.peer} for {self.timeout:g} s") from None
            if not n:
                if between_frames and got == 0:
                    raise ConnectionClosed(f"{self.peer} closed the link")
                raise ProtocolError(f"{self.peer} closed the link mid-frame ({got} of {len(view)} bytes)")
            got += n

    # -- ending -----------------------------------------------------------------------------------
    def abort(self) -> None:
        """Cut the connection (any thread): a thread blocked on it wakes with an error, the peer sees the end."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


async def run_on_own_thread(link: ThreadFrameLink, work: Callable[..., T], *args) -> T:
    """`work(*args)` on a thread of its own (a bulk transfer must not take a shared pool's threads).
    Cancelled: the link is aborted, which ends `work`, and this returns once the thread has."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    # Its error reaches the awaiting task through the shield; when that task was cancelled first, nobody
    # asks: mark it taken, or its garbage collection logs "exception was never retrieved" with a traceback.
    done.add_done_callback(lambda f: f.cancelled() or f.exception())

    def settle(outcome, error):
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(outcome)

    def body():
        outcome, error = None, None
        try:
            outcome = work(*args)
        except BaseException as e:  # noqa: BLE001 (handed to the awaiting task)
            error = e
        try:
            loop.call_soon_threadsafe(settle, outcome, error)
        except RuntimeError:
            pass  # the loop is gone: nobody waits any more

    thread = threading.Thread(target=body, name=f"link-{link.peer}", daemon=True)
    thread.start()
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        link.abort()
        await asyncio.wait([done])
        raise
