"""Proof of layers: a node shows that it holds the weights of the layers it claims (event loop).

A node says in its profile which layers it holds (`holds=START-END`). Anyone may say so; a
planner believes it only after a challenge over a peer link of purpose "prove" (behind the same
hello as every link, so sealed in a swarm with a secret):

    challenger -> candidate   prove {fingerprint, nonce, ranges: [[chunk, offset, length], ...], whole: [chunk]}
    candidate -> challenger   proof {digest} + the bytes of the `whole` chunks, in order
                              (or proof {refused: why}: it does not hold them)

digest = BLAKE3(nonce || the bytes of every range, in order). The challenger picks the ranges at
random inside the tensors of the claimed layers, in chunks it holds itself, and hashes its own
copy with a fresh nonce, so no earlier answer and no manifest hash can stand in for the bytes.
A challenger that holds none of those tensors (a node that fetched other layers) asks for one
small chunk of them whole instead and checks it against the manifest's hash: weaker (a small
tensor is cheap to hold) but never fooled by a node that holds nothing.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import random
from dataclasses import dataclass
from typing import Awaitable, Callable

import blake3

from ..models.manifest import Chunk, chunk_hasher
from ..transport.errors import ProtocolError
from .store import ChunkStore
from .transfer import FrameLink

log = logging.getLogger(__name__)

PROVE_PURPOSE = "prove"
RANGES = 8  # a node that holds a fraction f of the claimed tensors passes with about f**8
RANGE_BYTES = 4096
MAX_RANGES = 64  # what a candidate answers at most, per challenge
MAX_RANGE_BYTES = 64 * 1024
MAX_WHOLE_BYTES = 16 * 1024 * 1024  # a whole chunk asked for: at most one manifest chunk
PROVE_MAX_PAYLOAD = MAX_WHOLE_BYTES + 4096
NONCE_BYTES = 16


class ProofFailed(Exception):
    """The candidate refused, answered wrong, or sent something that is not an answer."""


@dataclass(frozen=True)
class Challenge:
    nonce: bytes
    ranges: tuple[tuple[Chunk, int, int], ...]  # (chunk, offset in it, length)
    whole: tuple[Chunk, ...]

    def header(self, fingerprint: str) -> dict:
        return {"t": "prove", "fingerprint": fingerprint, "nonce": self.nonce.hex(),
                "ranges": [[c.index, off, n] for c, off, n in self.ranges], "whole": [c.index for c in self.whole]}


def parse_holds(value: str | None, n_layers: int) -> tuple[int, int] | None:
    """A profile's `holds` field as a layer range within the model (None: none, or garbled)."""
    start, sep, end = (value or "").partition("-")
    if not sep or not start.isdigit() or not end.isdigit():
        return None
    a, b = int(start), int(end)
    return (a, b) if 0 <= a < b <= n_layers else None


def make_challenge(store: ChunkStore, chunks: list[Chunk], rng: random.Random | None = None) -> Challenge:
    """Random ranges inside the tensor chunks of the claimed layers that we hold; with none held, the
    smallest such chunk asked for whole. ValueError: the claimed layers have no tensor to ask about."""
    rng = rng or random.SystemRandom()
    tensors = [c for c in chunks if c.tensor and c.length > 0]
    if not tensors:
        raise ValueError("the claimed layers have no tensors")
    held = [c for c in tensors if store.has(c)]
    nonce = os.urandom(NONCE_BYTES)
    if not held:
        return Challenge(nonce, (), (min(tensors, key=lambda c: (c.length, c.index)),))
    ranges = []
    for _ in range(RANGES):
        c = rng.choice(held)
        n = min(RANGE_BYTES, c.length)
        ranges.append((c, rng.randrange(c.length - n + 1), n))
    return Challenge(nonce, tuple(ranges), ())


def read_ranges(store: ChunkStore, ranges) -> bytes:
    """The bytes of (chunk, offset, length) ranges of held chunks, in order (blocking file reads)."""
    out = bytearray()
    for chunk, offset, length in ranges:
        if not store.has(chunk):
            raise KeyError(f"chunk {chunk.index} is not held here")
        with open(store.root / chunk.file, "rb") as f:
            f.seek(chunk.offset + offset)
            out += f.read(length)
    return bytes(out)


def ranges_digest(nonce: bytes, data: bytes) -> str:
    return blake3.blake3(nonce + data).hexdigest()


async def challenge(link: FrameLink, store: ChunkStore, chunks: list[Chunk], timeout: float) -> None:
    """Challenge the node at the other end of `link` over `chunks` (the claimed layers'); ProofFailed
    if it does not prove it holds them within `timeout` (asyncio.TimeoutError)."""
    ch = make_challenge(store, chunks)
    expected = ranges_digest(ch.nonce, await asyncio.to_thread(read_ranges, store, ch.ranges)) if ch.ranges else ""
    await link.send(ch.header(store.manifest.fingerprint))
    frame = await asyncio.wait_for(link.receive(), timeout)
    header, payload = frame.header, bytes(frame.payload)
    if header.get("t") != "proof" or "refused" in header:
        raise ProofFailed(f"refused: {str(header.get('refused', header.get('t')))[:200]}")
    if ch.ranges and not hmac.compare_digest(str(header.get("digest", "")), expected):
        raise ProofFailed("wrong digest")
    at = 0
    for c in ch.whole:
        piece, at = payload[at:at + c.length], at + c.length
        hasher = chunk_hasher()
        hasher.update(piece)
        if len(piece) != c.length or hasher.hexdigest() != c.blake3:
            raise ProofFailed(f"chunk {c.index} does not match the manifest")
    if at != len(payload):
        raise ProofFailed("more bytes than asked for")


def serve_proofs(store_of: Callable[[], ChunkStore | None]) -> Callable[[FrameLink], Awaitable[None]]:
    """The listener's handler for "prove" links: one challenge answered from what this node holds."""
    async def handler(link: FrameLink) -> None:
        frame = await link.receive()
        store = store_of()
        try:
            ranges, whole = _parse(frame.header, store)
        except LookupError as e:
            await link.send({"t": "proof", "refused": str(e)[:200]})
            return
        data = await asyncio.to_thread(read_ranges, store, ranges)
        payload = await asyncio.to_thread(read_ranges, store, [(c, 0, c.length) for c in whole])
        await link.send({"t": "proof", "digest": ranges_digest(bytes.fromhex(frame.header["nonce"]), data)}, payload)
    return handler


def _parse(header: dict, store: ChunkStore | None) -> tuple[list[tuple[Chunk, int, int]], list[Chunk]]:
    """The ranges and whole chunks a challenge asks for; ProtocolError for a malformed one, LookupError
    for one this node cannot answer (another model, chunks it does not hold)."""
    if header.get("t") != "prove":
        raise ProtocolError(f"unexpected {header.get('t')!r} on a prove link")
    nonce, raw_ranges, raw_whole = header.get("nonce"), header.get("ranges"), header.get("whole")
    if not isinstance(nonce, str) or len(nonce) != 2 * NONCE_BYTES or not all(ch in "0123456789abcdef" for ch in nonce):
        raise ProtocolError("a challenge needs a nonce of 16 bytes in hex")
    if not isinstance(raw_ranges, list) or len(raw_ranges) > MAX_RANGES or not isinstance(raw_whole, list) \
            or len(raw_whole) > 1:
        raise ProtocolError(f"a challenge asks for at most {MAX_RANGES} ranges and one whole chunk")
    if store is None or header.get("fingerprint") != store.manifest.fingerprint:
        raise LookupError("this node does not hold that model")
    chunks = store.manifest.chunks
    ranges = []
    for r in raw_ranges:
        if not (isinstance(r, list) and len(r) == 3 and all(type(x) is int for x in r) and 0 <= r[0] < len(chunks)):
            raise ProtocolError("a range is [chunk, offset, length]")
        c, offset, length = chunks[r[0]], r[1], r[2]
        if not (0 <= offset and 0 < length <= MAX_RANGE_BYTES and offset + length <= c.length):
            raise ProtocolError(f"range {r} is not inside chunk {c.index}")
        ranges.append((c, offset, length))
    if not all(type(i) is int and 0 <= i < len(chunks) for i in raw_whole):
        raise ProtocolError("whole chunks are chunk indices")
    whole = [chunks[i] for i in raw_whole]
    if any(c.length > MAX_WHOLE_BYTES for c in whole):
        raise ProtocolError("a whole chunk asked for is too large")
    missing = [c.index for c, _, _ in ranges if not store.has(c)] + [c.index for c in whole if not store.has(c)]
    if missing:
        raise LookupError(f"chunks {sorted(set(missing))[:8]} are not held here")
    return ranges, whole
