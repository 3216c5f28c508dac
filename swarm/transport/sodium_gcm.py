"""AES-256-GCM on a hop's frames through libsodium, called directly: half the price of a cold call.

A decode step's frame is sealed right after the sender's forward pass and opened right after the
receiver woke, when the caches hold none of the code a call runs. There one call of `cryptography`'s
AESGCM (OpenSSL's EVP layer: a cipher context copied, set up and freed per call) took 34-38 µs, and
libsodium's AES-256-GCM, called with pointers kept from one frame to the next, 17-20 µs
(benchmarks/aead_cold.py; warm both take ~2 µs). Same cipher, same bytes: a frame sealed by one opens
with the other, so nodes that use either talk to each other (tests/test_link_crypto.py).

libsodium is the copy PyNaCl bundles, reached through its compiled cffi module (`nacl._sodium`: the C
functions themselves, without PyNaCl's checking wrappers, which allocate the output and cost more
than the call). `SEALS_IN_PLACE` is False when that module or the CPU's AES instructions are missing
(libsodium's AES-GCM needs AES-NI and PCLMUL, or ARMv8's crypto extensions), or when
SWARM_SODIUM=off; link_crypto.py then uses `cryptography` for these frames too.
"""

from __future__ import annotations

import os

try:
    from nacl._sodium import ffi, lib
except ImportError:  # no PyNaCl, or a build without this module
    ffi = lib = None

SEALS_IN_PLACE = (lib is not None and os.environ.get("SWARM_SODIUM", "").lower() != "off"
                  and lib.sodium_init() >= 0 and lib.crypto_aead_aes256gcm_is_available() == 1)

if SEALS_IN_PLACE:
    _encrypt, _decrypt, _NULL = lib.crypto_aead_aes256gcm_encrypt, lib.crypto_aead_aes256gcm_decrypt, ffi.NULL
    pointer_to = ffi.from_buffer


def seal_in_place(at, n: int, associated: bytes, nonce: bytes, key: bytes) -> None:
    """The `n` bytes at pointer `at` sealed where they are, the 16-byte tag after them."""
    if _encrypt(at, _NULL, at, n, associated, len(associated), _NULL, nonce, key) != 0:
        raise ValueError(f"libsodium refused to seal {n} bytes")


def open_in_place(buffer: bytearray, associated_len: int, sealed_len: int, nonce: bytes, key: bytes) -> bool:
    """Open the sealed bytes that follow `associated_len` bytes of associated data at the start of
    `buffer`, where they are (the plaintext then starts at the same place); False if they do not."""
    at = pointer_to(buffer)
    body = at + associated_len
    return _decrypt(body, _NULL, _NULL, body, sealed_len, at, associated_len, nonce, key) == 0
