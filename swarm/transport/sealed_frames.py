"""Frames sealed with a link's keys: what a peer link carries after a handshake with a swarm secret.

    sealed frame: u32 header_len | u32 payload_len | sealed header | sealed payload   (big-endian)
    a payload of up to JOIN_MAX_PAYLOAD:  seal(header + payload)          one AEAD call, one tag
                                          (header_len counts the tag, payload_len does not)
    a larger one:                         seal(header) | seal(payload)    two; each length counts its tag

Sealed with AES-GCM (link_crypto.py), the 8-byte prefix as associated data, each seal
taking the next number of the sender's counter: a frame that was altered, replayed,
reordered or dropped does not open (LinkAuthError), and its link is closed. As in a
plain frame the two lengths add up to the bytes that follow, so whatever arrives in
place of a sealed frame is read whole and fails to open; which of the two shapes a
frame has follows from its payload_len, which the tag authenticates.

Why two shapes: a decode step's frame (a few kB) is on every hop, sealed right after a
forward pass, where each AEAD call runs cold (ten times its warm price) and a new
ciphertext of 1 KiB or more pays glibc's merge of the pass's freed blocks: so one call,
in place in the sealer's kept buffer (`reuse`; docs/performance.md). Joining header and
payload copies a few kB. A prefill's MBs are sealed on their own, so the ciphertext is
the only copy made of them (that copy is the cost).
"""

from __future__ import annotations

import asyncio

from .errors import ConnectionClosed, ProtocolError
from .frames import PREFIX, Frame, FrameParser, check_lengths, decode_header, pack_header
from .link_crypto import TAG_BYTES, FrameOpener, FrameSealer, LinkAuthError, StreamedSeal

# Up to here a payload is sealed with its header (a decode step's hidden states: 2.3 kB for
# SmolLM2, 32 kB for an 8192-wide float32 model); copying 32 kB costs a few µs, less than a cold call.
JOIN_MAX_PAYLOAD = 32 * 1024


def seal_frame(sealer: FrameSealer, header: dict, payload: bytes | memoryview = b"", *,
               reuse: bool = False, into: bytearray | None = None) -> list[bytes | memoryview]:
    """The pieces of one sealed frame (a bad header is the caller's bug: ValueError).

    `reuse`: a small frame is sealed in place in the sealer's own buffer (FrameSealer.seal_into), so
    the pieces are good until the next frame is sealed: for a writer that sends them at once
    (connection.py, the hop), never for one that may queue them (asyncio's writelines).
    `into`: a large payload is sealed into this buffer (its length + TAG_BYTES at least), good
    until the caller uses it again (weights, thread_link.py)."""
    packed = pack_header(header)
    view = memoryview(payload)
    n = view.nbytes
    if n <= JOIN_MAX_PAYLOAD:
        prefix = PREFIX.pack(len(packed) + TAG_BYTES, n)
        if reuse:
            return [prefix, sealer.seal_into(prefix, packed, view if view.format == "B" else view.cast("B"))]
        return [prefix, sealer.seal(prefix, packed + payload if n else packed)]
    prefix, sealed_header = _large_frame_head(sealer, packed, n)
    sealed_payload = sealer.seal(prefix, payload) if into is None else sealer.seal_to(prefix, payload, into)
    return [prefix, sealed_header, sealed_payload]


def seal_frame_head(sealer: FrameSealer, header: dict, n: int) -> tuple[bytes, StreamedSeal]:
    """A frame with a payload of `n` > JOIN_MAX_PAYLOAD bytes, sealed as its payload is read (weights,
    thread_link.py): the prefix and sealed header to send first, and the seal each piece of the payload
    goes through, whose tag ends the frame. The same bytes as seal_frame's."""
    prefix, sealed_header = _large_frame_head(sealer, pack_header(header), n)
    return prefix + sealed_header, sealer.seal_in_pieces(prefix)


def _large_frame_head(sealer: FrameSealer, packed: bytes, n: int) -> tuple[bytes, bytes]:
    """The prefix and sealed header of a frame whose `n`-byte payload is sealed on its own."""
    prefix = PREFIX.pack(len(packed) + TAG_BYTES, n + TAG_BYTES)
    return prefix, sealer.seal(prefix, packed)  # first: the header takes the lower number


def check_sealed_lengths(header_len: int, payload_len: int, max_payload: int) -> None:
    """ProtocolError for a sealed frame's prefix that no sealed frame has (before reading on)."""
    if header_len <= TAG_BYTES or JOIN_MAX_PAYLOAD < payload_len <= JOIN_MAX_PAYLOAD + TAG_BYTES:
        raise ProtocolError(f"sealed frame lengths {header_len}/{payload_len}: no sealed frame has them")
    joined = payload_len <= JOIN_MAX_PAYLOAD
    check_lengths(header_len - TAG_BYTES, payload_len if joined else payload_len - TAG_BYTES, max_payload)


def open_body(opener: FrameOpener, prefix: bytes, body: memoryview | bytes, header_len: int,
              payload_len: int) -> Frame:
    """The frame in a sealed frame's body (the header_len + payload_len bytes after its prefix);
    ProtocolError if it does not open."""
    try:
        if payload_len <= JOIN_MAX_PAYLOAD:
            plain = opener.open(prefix, body)
            split = header_len - TAG_BYTES
            return Frame(decode_header(plain[:split]), memoryview(plain)[split:] if payload_len else b"")
        header = decode_header(opener.open(prefix, body[:header_len]))
        return Frame(header, opener.open(prefix, body[header_len:]))
    except LinkAuthError as e:
        raise ProtocolError(str(e)) from None


class SealedFrameParser(FrameParser):
    """Bytes in, opened frames out: FrameParser's loop and checks, sealed bodies."""

    def __init__(self, opener: FrameOpener, max_payload: int) -> None:
        super().__init__(max_payload)
        self.opener = opener

    def _body_bytes(self, header_len: int, payload_len: int) -> int:
        check_sealed_lengths(header_len, payload_len, self.max_payload)
        return header_len + payload_len

    def _take(self, view: memoryview, header_len: int, payload_len: int, end: int) -> Frame:
        if payload_len > JOIN_MAX_PAYLOAD:
            return open_body(self.opener, bytes(view[:PREFIX.size]), view[PREFIX.size:end], header_len, payload_len)
        # A hop's frame: opened in the opener's kept buffer (FrameOpener.open_kept), then taken as the
        # plain parser takes a frame.
        try:
            plain = self.opener.open_kept(view[:end], PREFIX.size)
        except LinkAuthError as e:
            raise ProtocolError(str(e)) from None
        split = header_len - TAG_BYTES
        return Frame(decode_header(bytes(plain[:split])), bytes(plain[split:]) if payload_len else b"")


async def read_sealed_frame(reader: asyncio.StreamReader, opener: FrameOpener, max_payload: int) -> Frame:
    """frames.read_frame for a sealed link."""
    try:
        prefix = await reader.readexactly(PREFIX.size)
        header_len, payload_len = PREFIX.unpack(prefix)
        check_sealed_lengths(header_len, payload_len, max_payload)
        body = await reader.readexactly(header_len + payload_len)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial and exc.expected == PREFIX.size:
            raise ConnectionClosed("connection closed between frames") from exc
        raise ProtocolError(f"connection closed mid-frame ({len(exc.partial)} of {exc.expected} bytes)") from exc
    return open_body(opener, prefix, body, header_len, payload_len)
