"""Frames sealed with a link's keys: what a peer link carries after a handshake with a swarm secret.

    sealed frame: u32 header_len | u32 payload_len | sealed header | sealed payload   (big-endian)

The shape of a plain frame (frames.py), each part sealed on its own with AES-GCM
(link_crypto.py), the 8-byte prefix as associated data, each taking the next number
of the sender's counter: a frame that was altered, replayed, reordered or dropped
does not open (LinkAuthError), and its link is closed. Lengths include the 16-byte
tags; an empty payload stays empty. Sealing the payload on its own keeps it out of
any join: the ciphertext is the only copy made of it (for MBs of prefill activations,
that copy is the cost: see docs/performance.md).
"""

from __future__ import annotations

import asyncio

from .errors import ConnectionClosed, ProtocolError
from .frames import PREFIX, Frame, check_lengths, decode_header, pack_header
from .link_crypto import TAG_BYTES, FrameOpener, FrameSealer, LinkAuthError


def seal_frame(sealer: FrameSealer, header: dict, payload: bytes | memoryview = b"") -> list[bytes]:
    """The pieces of one sealed frame (a bad header is the caller's bug: ValueError)."""
    packed = pack_header(header)
    n = memoryview(payload).nbytes
    prefix = PREFIX.pack(len(packed) + TAG_BYTES, n + TAG_BYTES if n else 0)
    pieces = [prefix + sealer.seal(prefix, packed)]
    if n:
        pieces.append(sealer.seal(prefix, payload))
    return pieces


def _sealed_lengths(prefix: bytes | bytearray, max_payload: int) -> tuple[int, int]:
    header_len, payload_len = PREFIX.unpack_from(prefix)
    if header_len <= TAG_BYTES or 0 < payload_len <= TAG_BYTES:
        raise ProtocolError(f"sealed frame lengths {header_len}/{payload_len}: shorter than their tags")
    check_lengths(header_len - TAG_BYTES, max(0, payload_len - TAG_BYTES), max_payload)
    return header_len, payload_len


def _open(opener: FrameOpener, prefix: bytes, sealed_header, sealed_payload) -> Frame:
    try:
        header = decode_header(opener.open(prefix, sealed_header))
        payload = opener.open(prefix, sealed_payload) if len(sealed_payload) else b""
    except LinkAuthError as e:
        raise ProtocolError(str(e)) from None
    return Frame(header, payload)


class SealedFrameParser:
    """Bytes in, opened frames out (the FrameParser of a sealed link, same checks first)."""

    def __init__(self, opener: FrameOpener, max_payload: int) -> None:
        self.opener, self.max_payload = opener, max_payload
        self._buf = bytearray()

    @property
    def mid_frame(self) -> bool:
        return bool(self._buf)

    def feed(self, data: bytes | memoryview, max_frames: int | None = None) -> list[Frame]:
        self._buf += data
        frames: list[Frame] = []
        while len(self._buf) >= PREFIX.size and (max_frames is None or len(frames) < max_frames):
            header_len, payload_len = _sealed_lengths(self._buf, self.max_payload)
            end = PREFIX.size + header_len + payload_len
            if len(self._buf) < end:
                break
            view = memoryview(self._buf)
            try:
                frame = _open(self.opener, bytes(view[:PREFIX.size]), view[PREFIX.size:PREFIX.size + header_len],
                              view[PREFIX.size + header_len:end])
            finally:
                view.release()  # before the buffer is resized below
            del self._buf[:end]
            frames.append(frame)
        return frames


async def read_sealed_frame(reader: asyncio.StreamReader, opener: FrameOpener, max_payload: int) -> Frame:
    """frames.read_frame for a sealed link."""
    try:
        prefix = await reader.readexactly(PREFIX.size)
        header_len, payload_len = _sealed_lengths(prefix, max_payload)
        sealed_header = await reader.readexactly(header_len)
        sealed_payload = await reader.readexactly(payload_len) if payload_len else b""
    except asyncio.IncompleteReadError as exc:
        if not exc.partial and exc.expected == PREFIX.size:
            raise ConnectionClosed("connection closed between frames") from exc
        raise ProtocolError(f"connection closed mid-frame ({len(exc.partial)} of {exc.expected} bytes)") from exc
    return _open(opener, prefix, sealed_header, sealed_payload)
