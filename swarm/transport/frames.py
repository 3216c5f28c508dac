"""Wire format of the peer protocol: a magic, then length-prefixed frames.

    connection: b"SWRM" frame*
    frame:      u32 header_len | u32 payload_len | header | payload   (big-endian)

The header is a msgpack map with str keys and at least "t" (the message type:
messages.py gives each type its fields); the payload is raw bytes (activations),
never parsed here. msgpack only: no
pickle, no ext types, so a hostile peer can make us build nothing but plain
dicts/lists/str/bytes/numbers.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from .errors import ConnectionClosed, ProtocolError

MAGIC = b"SWRM"
MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
PREFIX = struct.Struct(">II")
# msgpack's own default is a 256 KiB buffer per packb: a large malloc on every frame, which
# after a forward pass makes glibc merge all the small blocks MLX just freed. Headers are
# ~200 bytes; 512 stays in Python's small-object allocator (it grows when a header needs it).
_PACK_BUFFER_BYTES = 512


@dataclass(frozen=True)
class Frame:
    header: dict[str, Any]
    payload: bytes | memoryview = b""

    @property
    def type(self) -> str:
        return self.header["t"]


def _reject_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack ext type {code} in header")


def pack_header(header: dict[str, Any]) -> bytes:
    """A frame header as msgpack; ValueError for one that is not ours to send (the caller's bug)."""
    if not isinstance(header.get("t"), str):
        raise ValueError(f"frame header needs a str 't', got {header!r}")
    packed = msgpack.packb(header, use_bin_type=True, buf_size=_PACK_BUFFER_BYTES)
    if len(packed) > MAX_HEADER_BYTES:
        raise ValueError(f"frame header is {len(packed)} bytes (max {MAX_HEADER_BYTES})")
    return packed


def encode_frame(header: dict[str, Any], payload: bytes | memoryview = b"") -> list[bytes | memoryview]:
    """The pieces of one frame, for `writer.writelines` (the payload is not copied here)."""
    packed = pack_header(header)
    payload_len = memoryview(payload).nbytes
    return [PREFIX.pack(len(packed), payload_len) + packed, payload]


def check_lengths(header_len: int, payload_len: int, max_payload: int) -> None:
    """ProtocolError for a length prefix that asks for more than a frame may hold (before reading it)."""
    if header_len > MAX_HEADER_BYTES:
        raise ProtocolError(f"frame header of {header_len} bytes (max {MAX_HEADER_BYTES})")
    if payload_len > max_payload:
        raise ProtocolError(f"frame payload of {payload_len} bytes (max {max_payload})")


def decode_header(packed: bytes) -> dict[str, Any]:
    try:
        header = msgpack.unpackb(packed, raw=False, strict_map_key=True, ext_hook=_reject_ext)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types for bad input
        raise ProtocolError(f"undecodable frame header: {type(exc).__name__}: {exc}") from exc
    if not isinstance(header, dict):
        raise ProtocolError(f"frame header is a {type(header).__name__}, not a map")
    if not isinstance(header.get("t"), str):
        raise ProtocolError("frame header has no str 't' (message type)")
    return header


async def read_frame(reader: asyncio.StreamReader, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Frame:
    """Read one frame; ProtocolError for anything malformed, truncated or oversized.

    A clean close between two frames raises ConnectionClosed (a ProtocolError
    too, so callers that only care about "no more frames" catch one type).

    Lengths are checked before anything is read, so a lying length prefix
    costs no memory.
    """
    try:
        header_len, payload_len = PREFIX.unpack(await reader.readexactly(PREFIX.size))
        check_lengths(header_len, payload_len, max_payload)
        header = decode_header(await reader.readexactly(header_len))
        payload = await reader.readexactly(payload_len) if payload_len else b""
    except asyncio.IncompleteReadError as exc:
        if not exc.partial and exc.expected == PREFIX.size:
            raise ConnectionClosed("connection closed between frames") from exc
        raise ProtocolError(f"connection closed mid-frame ({len(exc.partial)} of {exc.expected} bytes)") from exc
    return Frame(header, payload)


class FrameParser:
    """Bytes in, whole frames out, for a connection read as data arrives (connection.py).

    Same checks as read_frame: lengths as soon as a frame's 8-byte prefix is in, so a
    lying prefix costs no memory; ProtocolError for anything malformed or oversized.
    The loop is the sealed parser's too (sealed_frames.py): it overrides `_body_bytes`
    and `_take`, the two things a sealed frame does differently."""

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
        self.max_payload = max_payload
        self._buf = bytearray()

    @property
    def mid_frame(self) -> bool:
        return bool(self._buf)

    def feed(self, data: bytes | memoryview, max_frames: int | None = None) -> list[Frame]:
        """The whole frames `data` completes (at most `max_frames`: the rest stays for `take_rest`)."""
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        while len(buf) >= PREFIX.size and (max_frames is None or len(frames) < max_frames):
            header_len, payload_len = PREFIX.unpack_from(buf)
            end = PREFIX.size + self._body_bytes(header_len, payload_len)
            if len(buf) < end:
                break
            view = memoryview(buf)  # one copy out of the buffer (a bytearray slice would be two)
            try:
                frames.append(self._take(view, header_len, payload_len, end))
            finally:
                view.release()  # before the buffer is resized
            del buf[:end]
        return frames

    def _body_bytes(self, header_len: int, payload_len: int) -> int:
        """How many bytes follow the prefix; ProtocolError for lengths no frame may have."""
        check_lengths(header_len, payload_len, self.max_payload)
        return header_len + payload_len

    def _take(self, view: memoryview, header_len: int, payload_len: int, end: int) -> Frame:
        """The frame in view[:end] (copied out: the buffer is reused)."""
        header = decode_header(bytes(view[PREFIX.size:PREFIX.size + header_len]))
        return Frame(header, bytes(view[PREFIX.size + header_len:end]) if payload_len else b"")

    def take_rest(self) -> bytes:
        """What was fed beyond the frames taken (e.g. the sealed frames behind a plain hello)."""
        rest, self._buf = bytes(self._buf), bytearray()
        return rest


async def read_magic(reader: asyncio.StreamReader) -> bytes:
    """The first 4 bytes of a connection; b"" when the peer closed without sending any.

    Raises ProtocolError when it closed after 1-3 bytes (garbage, not a probe).
    """
    try:
        return await reader.readexactly(len(MAGIC))
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ProtocolError(f"connection closed after {len(exc.partial)} bytes: {exc.partial!r}") from exc
        return b""
