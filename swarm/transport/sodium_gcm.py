"""AES-256-GCM on a hop's frames through libsodium, called directly: half the price of a cold call.

A decode step's frame is sealed right after the sender's forward pass and opened right after the
receiver woke, when the caches hold none of the code a call runs. There one call of `cryptography`'s
AESGCM (OpenSSL's EVP layer: a cipher context copied, set up and freed per call) costs about twice
what libsodium's AES-256-GCM costs, called with pointers kept from one frame to the next (warm, both
are alike; docs/performance.md). Same cipher, same bytes: a frame sealed by one opens
with the other, so nodes that use either talk to each other (tests/test_link_crypto.py).

libsodium is the copy PyNaCl bundles, reached through its compiled cffi module (`nacl._sodium`: the C
functions themselves, without PyNaCl's checking wrappers, which allocate the output and cost more
than the call). `IN_USE` is False when that module or the CPU's AES instructions are missing
(libsodium's AES-GCM needs AES-NI and PCLMUL, or ARMv8's crypto extensions), or when
SWARM_SODIUM=off; link_crypto.py then uses `cryptography` for these frames too.
"""

from __future__ import annotations

from .. import environment

try:
    from nacl._sodium import ffi, lib
except ImportError:  # no PyNaCl, or a build without this module
    ffi = lib = None


def _usable() -> bool:
    if lib is None or environment.SODIUM.is_off():
        return False
    try:
        return lib.sodium_init() >= 0 and lib.crypto_aead_aes256gcm_is_available() == 1
    except AttributeError:  # a PyNaCl whose module does not declare these functions
        return False


IN_USE = _usable()

# libsodium's functions themselves, called inline by link_crypto.py (one Python call fewer on a cold path):
#   encrypt(c, NULL, m, mlen, ad, adlen, NULL, nonce, key) -> 0     c: mlen + 16 bytes (tag last); c may be m
#   decrypt(m, NULL, NULL, c, clen, ad, adlen, nonce, key) -> 0, or -1 if it does not open;       m may be c
# The buffers are pointers (`pointer_to(a bytearray)`, kept: taking one costs a third of a cold seal) or bytes.
encrypt = decrypt = pointer_to = NULL = None
if IN_USE:
    encrypt, decrypt = lib.crypto_aead_aes256gcm_encrypt, lib.crypto_aead_aes256gcm_decrypt
    pointer_to, NULL = ffi.from_buffer, ffi.NULL
