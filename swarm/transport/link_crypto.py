"""The cryptography of one peer link: mutual proof of the swarm secret, then sealed frames.

Sans-IO: the connection code moves the bytes; this module only computes and checks.

Handshake (both sides know the swarm secret K; n_c, n_s are fresh 32-byte nonces):

    client -> server   hello {node_id c, swarm, nonce n_c}
    server -> client   hello {node_id s, swarm, nonce n_s, proof HMAC(K', "server" | T)}
    client -> server   proof {HMAC(K', "client" | T)}

T, the transcript, binds the protocol version, the swarm name, both node ids and both
nonces, so a proof is good for this one connection only: a recorded handshake
replayed later meets a fresh nonce and fails. The server proves itself first,
but its proof is labelled "server", so a stranger cannot use it to pass as a client.

K' is K stretched by scrypt (32 MiB, ~0.1-0.4 s, once per node start). Whoever proves
first hands a stranger one HMAC it can test guesses against offline; scrypt makes
each guess cost that much, and `swarm-node --new-secret` writes 256 random bits,
which no guessing reaches.

Frames after the handshake are sealed with AES-256-GCM (AES-NI or ARMv8's crypto extensions
make it cheap next to a hop), one key per direction derived from K' and T. The nonce is a
counter each side keeps: a frame that is replayed, dropped, reordered or altered
fails to open, and the link is closed. A hop's frames (seal_into, open_kept) go through
libsodium where it can (sodium_gcm.py: the same bytes at half the cold price), the rest
through `cryptography`.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import struct
from dataclasses import dataclass

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from . import sodium_gcm

NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size  # a proof is an HMAC-SHA256
TAG_BYTES = 16
_KEY_INFO = b"swarm link keys v1"
_SECRET_SALT = b"swarm secret v1"
_SCRYPT_N = 2**15  # x 8 x 128 bytes = 32 MiB
_COUNTER = struct.Struct(">4xQ")  # AES-GCM's 96-bit nonce: 4 zero bytes and a 64-bit frame counter
_NULL = sodium_gcm.NULL
# GCM's update_into wants room for a block more than it is given (a stream cipher: it never writes it)
PIECE_SPARE = 15


class LinkAuthError(Exception):
    """The peer did not prove the swarm secret, or a sealed frame did not open."""


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


@functools.lru_cache(maxsize=8)
def stretch_secret(secret: str | bytes) -> bytes:
    """The 32-byte key every proof and link key derives from (slow on purpose: see above)."""
    raw = secret.encode() if isinstance(secret, str) else secret
    if not raw:
        raise ValueError("the swarm secret is empty")
    return Scrypt(salt=_SECRET_SALT, length=32, n=_SCRYPT_N, r=8, p=1).derive(raw)


@dataclass(frozen=True)
class Transcript:
    """What both sides' proofs and keys are bound to."""

    version: int
    swarm: str
    client_id: str
    server_id: str
    client_nonce: bytes
    server_nonce: bytes

    def __post_init__(self) -> None:
        for nonce in (self.client_nonce, self.server_nonce):
            if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
                raise LinkAuthError(f"a handshake nonce must be {NONCE_BYTES} bytes")

    def encode(self) -> bytes:
        return msgpack.packb([self.version, self.swarm, self.client_id, self.server_id,
                              self.client_nonce, self.server_nonce], use_bin_type=True)


def proof(key: bytes, role: str, transcript: Transcript) -> bytes:
    """HMAC-SHA256 proving knowledge of the secret for this transcript, as `role`."""
    if role not in ("client", "server"):
        raise ValueError(f"role must be client or server, not {role!r}")
    return hmac.new(key, role.encode() + b"|" + transcript.encode(), hashlib.sha256).digest()


def check_proof(key: bytes, role: str, transcript: Transcript, claimed: object) -> None:
    """LinkAuthError unless `claimed` is `role`'s proof for this transcript (constant time)."""
    if not isinstance(claimed, bytes) or not hmac.compare_digest(proof(key, role, transcript), claimed):
        raise LinkAuthError(f"the {role} did not prove the swarm secret")


@dataclass(frozen=True)
class LinkKeys:
    send: bytes
    receive: bytes


def link_keys(key: bytes, role: str, transcript: Transcript) -> LinkKeys:
    """This side's sending and receiving keys (the client's send key is the server's receive key)."""
    material = HKDF(hashes.SHA256(), 64, salt=transcript.client_nonce + transcript.server_nonce,
                    info=_KEY_INFO + transcript.encode()).derive(key)
    client_to_server, server_to_client = material[:32], material[32:]
    if role == "client":
        return LinkKeys(client_to_server, server_to_client)
    return LinkKeys(server_to_client, client_to_server)


class FrameSealer:
    """Seals the frames one side sends, numbering them. Not thread-safe: one writer per link."""

    def __init__(self, key: bytes) -> None:
        self._key, self._aead = key, AESGCM(key)
        self._sent = 0
        self._buffer = memoryview(bytearray())  # seal_into's, grown when a frame needs more
        self._at = None  # its address for sodium_gcm (kept: taking one costs a third of a seal, cold)

    def _next_nonce(self) -> bytes:
        nonce = _COUNTER.pack(self._sent)
        self._sent += 1
        return nonce

    def seal(self, associated: bytes, plaintext: bytes | bytearray | memoryview) -> bytes:
        """Ciphertext + tag of the next frame; `associated` (the length prefix) is authenticated too."""
        return self._aead.encrypt(self._next_nonce(), plaintext, associated)

    def seal_in_pieces(self, associated: bytes) -> StreamedSeal:
        """The next frame's payload sealed a piece at a time (StreamedSeal, below): the same bytes as `seal`."""
        return StreamedSeal(self._key, self._next_nonce(), associated)

    def seal_to(self, associated: bytes, plaintext: bytes | memoryview, out: bytearray) -> memoryview:
        """`seal` into `out` (at least the plaintext's length + TAG_BYTES), no new bytes (bulk payloads)."""
        n = memoryview(plaintext).nbytes
        sealed = memoryview(out)[:n + TAG_BYTES]
        self._aead.encrypt_into(self._next_nonce(), plaintext, associated, sealed)
        return sealed

    def seal_into(self, associated: bytes, header: bytes, payload: memoryview) -> memoryview:
        """`seal` of header + payload (a byte-format view), in a buffer this sealer keeps: valid
        until its next call.

        Why: on a hop this runs right after a forward pass, where every line of code and data it
        touches is cold (docs/performance.md), and glibc merges the small blocks the pass freed
        on the thread's next malloc of 1 KiB or more (a decode step's ciphertext would be one).
        So: one buffer, reused, sealed in place (AES-GCM allows it), by libsodium where it can
        (sodium_gcm.py: half the cold price of `cryptography`'s call, the same bytes)."""
        h = len(header)
        n = h + payload.nbytes
        buffer = self._buffer
        if buffer.nbytes < n + TAG_BYTES:  # a new buffer, not a resized one: a caller may still hold a view
            raw = bytearray(2 * n + TAG_BYTES)
            buffer, self._at = memoryview(raw), sodium_gcm.pointer_to(raw) if sodium_gcm.IN_USE else None
            self._buffer = buffer
        buffer[:h] = header  # a memoryview copies in place (a bytearray slice would copy first)
        buffer[h:n] = payload
        at = self._at
        if at is not None:
            if sodium_gcm.encrypt(at, _NULL, at, n, associated, len(associated), _NULL, self._next_nonce(), self._key):
                raise ValueError(f"libsodium refused to seal {n} bytes")
        else:
            self._aead.encrypt_into(self._next_nonce(), buffer[:n], associated, buffer[:n + TAG_BYTES])
        return buffer[:n + TAG_BYTES]


class FrameOpener:
    """Opens the frames the other side sealed, in order. LinkAuthError for anything else."""

    def __init__(self, key: bytes) -> None:
        self._key, self._aead = key, AESGCM(key)
        self._received = 0
        self._kept, self._kept_split, self._kept_at = memoryview(bytearray()), 0, None  # open_kept's

    def open_in_pieces(self, associated: bytes) -> StreamedOpen:
        """The next frame's payload opened a piece at a time (StreamedOpen, below; authentic only once its
        `finish` passes). Its number is taken now: if it fails, the link is closed anyway."""
        self._received += 1
        return StreamedOpen(self._key, _COUNTER.pack(self._received - 1), associated)

    def open(self, associated: bytes, sealed: bytes | bytearray | memoryview) -> bytes:
        try:
            plaintext = self._aead.decrypt(_COUNTER.pack(self._received), sealed, associated)
        except InvalidTag:
            raise LinkAuthError(f"frame {self._received} did not open: altered, replayed or out of order") from None
        self._received += 1
        return plaintext

    def open_kept(self, frame: memoryview, associated_len: int) -> memoryview:
        """Open a whole frame, `associated_len` bytes of associated data (its prefix) then sealed bytes,
        in a buffer this opener keeps: the plaintext, valid until the next call.

        For a hop's frames, opened cold right after the receiver woke: by libsodium where it can
        (sodium_gcm.py), at an address kept from frame to frame (taking one costs more than this
        copy), and no new object made."""
        n = frame.nbytes
        kept = self._kept
        if kept.nbytes < n or associated_len != self._kept_split:
            raw = bytearray(2 * n)
            kept = self._kept = memoryview(raw)
            self._kept_split = associated_len
            at = sodium_gcm.pointer_to(raw) if sodium_gcm.IN_USE else None
            self._kept_at = None if at is None else (at, at + associated_len)
        kept[:n] = frame
        nonce, sealed_len = _COUNTER.pack(self._received), n - associated_len
        if self._kept_at is not None:
            at, body = self._kept_at
            opened = not sodium_gcm.decrypt(body, _NULL, _NULL, body, sealed_len, at, associated_len, nonce, self._key)
        else:
            body = kept[associated_len:n]
            try:
                self._aead.decrypt_into(nonce, body, kept[:associated_len], body[:sealed_len - TAG_BYTES])
                opened = True
            except InvalidTag:
                opened = False
        if not opened:
            raise LinkAuthError(f"frame {self._received} did not open: altered, replayed or out of order")
        self._received += 1
        return kept[associated_len:n - TAG_BYTES]

    def open_into(self, associated: bytes, sealed: bytes | bytearray | memoryview, out: memoryview) -> memoryview:
        """`open` into `out` (the plaintext's length, not `sealed`'s memory), no new bytes: for bulk payloads,
        where a new 16 MiB plaintext per chunk would cost more CPU than the decryption itself."""
        try:
            self._aead.decrypt_into(_COUNTER.pack(self._received), sealed, associated, out)
        except InvalidTag:
            raise LinkAuthError(f"frame {self._received} did not open: altered, replayed or out of order") from None
        self._received += 1
        return out


# -- one large payload a piece at a time ----------------------------------------------------------
# AES-GCM is a stream cipher with a tag over the whole: cryptography's GCM encryptor and decryptor
# (update_into per piece, then the tag) give the bytes AESGCM's one call over the whole payload gives,
# so a peer cannot tell the two apart. Why: a 16 MiB weights chunk sealed or opened whole passes
# through memory three times more than one read, sealed and sent (or received, opened, hashed and
# written) 1 MiB at a time while that piece is in the core's cache (docs/performance.md).

class StreamedSeal:
    def __init__(self, key: bytes, nonce: bytes, associated: bytes) -> None:
        self._encryptor = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
        self._encryptor.authenticate_additional_data(associated)

    def update_into(self, plain: memoryview, out: bytearray) -> memoryview:
        """The next piece sealed into `out` (at least len(plain) + PIECE_SPARE bytes): a view of it."""
        return memoryview(out)[:self._encryptor.update_into(plain, out)]

    def finish(self) -> bytes:
        """The tag, sent after the last piece."""
        self._encryptor.finalize()
        return self._encryptor.tag


class StreamedOpen:
    """An opened piece is not authentic until `finish` accepts the tag: a caller keeps nothing of it before
    (the weights store holds a chunk only once both the tag and the chunk's hash checked out)."""

    def __init__(self, key: bytes, nonce: bytes, associated: bytes) -> None:
        self._decryptor = Cipher(algorithms.AES(key), modes.GCM(nonce)).decryptor()
        self._decryptor.authenticate_additional_data(associated)

    def update_into(self, sealed: memoryview, out: memoryview) -> memoryview:
        """The next piece opened into `out` (at least len(sealed) + PIECE_SPARE bytes): a view of it."""
        return out[:self._decryptor.update_into(sealed, out)]

    def finish(self, tag: bytes) -> None:
        """LinkAuthError unless `tag` is the payload's: only then are the pieces authentic."""
        try:
            self._decryptor.finalize_with_tag(tag)
        except InvalidTag:
            raise LinkAuthError("a payload did not open: altered, replayed or out of order") from None
