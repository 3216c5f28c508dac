"""What one AEAD call on a decode step's frame costs where a hop makes it: cold, not in a loop.

    python benchmarks/aead_cold.py [--model DIR] [--layers 2] [--steps 600] [--idle-ms 3]

A hop seals its frame right after the sender's forward pass, and opens it on a
receiver that has just woken from waiting. Warm, in a loop, either call takes 2-3 µs
for 2.3 kB; in place it took ~30 µs (docs/performance.md). This times one call of
each candidate after each decode step of a real stage ("after a pass") and after an
idle sleep of --idle-ms ("after idle": the receiver's case), rotating the candidates
step by step so all see the same machine, plus a 2.3 kB memcpy as the control for
"the caches are cold". Candidates: AES-GCM and ChaCha20-Poly1305 (`cryptography`),
encrypt_into / decrypt_into a kept buffer, and decrypt allocating the plaintext; the same
through libsodium and OpenSSL called directly (ctypes), and libsodium through PyNaCl's compiled
module as transport/sodium_gcm.py calls it; and the parts an encrypt-then-MAC of
our own would need (a numpy XOR, a BLAKE2b or HMAC tag).
Run it with OPENSSL_ia32cap set to see what a narrower instruction set changes, and with
LD_PRELOAD=<OpenBLAS> (what a node's re-exec does) and OPENBLAS_NUM_THREADS / OPENBLAS_THREAD_TIMEOUT
to see what OpenBLAS's spinning workers change; the thread-CPU column says whether a slow call
ran slowly (caches) or was off its core (another thread had it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305  # noqa: E402

from benchmarks.seal_after_forward import middle_stage  # noqa: E402
from swarm.engine.blas import blas_in_use  # noqa: E402


ASSOCIATED = b"\x00\x00\x00\xd0\x00\x00\x09\x00"


def candidates(n: int):
    key = bytes(range(32))
    plain = os.urandom(n)
    out = bytearray(n + 16)
    back = bytearray(n)
    ways = {}
    for name, cls in (("AES-GCM", AESGCM), ("ChaCha20-Poly1305", ChaCha20Poly1305)):
        aead = cls(key)
        nonce = bytes(12)
        sealed = aead.encrypt(nonce, plain, ASSOCIATED)
        ways[f"{name} encrypt_into"] = (lambda a=aead, nn=nonce: a.encrypt_into(nn, plain, ASSOCIATED, out))
        ways[f"{name} decrypt (new bytes)"] = (lambda a=aead, nn=nonce, s=sealed: a.decrypt(nn, s, ASSOCIATED))
        ways[f"{name} decrypt_into"] = (lambda a=aead, nn=nonce, s=sealed: a.decrypt_into(nn, s, ASSOCIATED, back))
    ways.update(_c_library_ways(key, plain, out))
    ways.update(_sodium_ways(key, plain))
    ways.update(_composition_ways(key, plain, out))
    src = bytearray(os.urandom(n))
    dst = bytearray(n)
    ways["control: memcpy of the frame"] = lambda: memoryview(dst).__setitem__(slice(None), src)
    return ways


def _c_library_ways(key: bytes, plain: bytes, out: bytearray) -> dict:
    """The same seal through C libraries called directly, kept buffers, no Python object made:
    libsodium's (1.0.18 here, via ctypes: what PyNaCl's bundled copy would run) and
    OpenSSL's EVP with one context kept per key (only the nonce set per call). Measurement only."""
    import ctypes
    ways = {}
    c_out = (ctypes.c_char * len(out)).from_buffer(out)
    n = len(plain)
    try:
        na = ctypes.CDLL("libsodium.so.23")
        na.sodium_init()
        outlen = ctypes.c_ulonglong()
        nonce = ctypes.create_string_buffer(12)
        for name, fn in (("chacha20poly1305_ietf", na.crypto_aead_chacha20poly1305_ietf_encrypt),
                         ("aes256gcm", na.crypto_aead_aes256gcm_encrypt)):
            ways[f"libsodium {name} encrypt (ctypes)"] = (
                lambda f=fn: f(c_out, ctypes.byref(outlen), plain, ctypes.c_ulonglong(n), ASSOCIATED,
                               ctypes.c_ulonglong(len(ASSOCIATED)), None, nonce, key))
    except OSError:
        pass
    try:
        cr = ctypes.CDLL("libcrypto.so.3")
        cr.EVP_CIPHER_CTX_new.restype = ctypes.c_void_p
        cr.EVP_aes_256_gcm.restype = ctypes.c_void_p
        ctx = ctypes.c_void_p(cr.EVP_CIPHER_CTX_new())
        cr.EVP_EncryptInit_ex(ctx, ctypes.c_void_p(cr.EVP_aes_256_gcm()), None, key, bytes(12))
        outl = ctypes.c_int()
        iv = bytes(12)
        tag = ctypes.create_string_buffer(16)

        def evp():
            cr.EVP_EncryptInit_ex(ctx, None, None, None, iv)
            cr.EVP_EncryptUpdate(ctx, None, ctypes.byref(outl), ASSOCIATED, len(ASSOCIATED))
            cr.EVP_EncryptUpdate(ctx, c_out, ctypes.byref(outl), plain, n)
            cr.EVP_EncryptFinal_ex(ctx, None, ctypes.byref(outl))
            cr.EVP_CIPHER_CTX_ctrl(ctx, 0x10, 16, tag)  # EVP_CTRL_GCM_GET_TAG
        ways["OpenSSL 3 EVP aes-256-gcm, kept context (ctypes)"] = evp
    except OSError:
        pass
    return ways


def _sodium_ways(key: bytes, plain: bytes) -> dict:
    """libsodium through PyNaCl's compiled module, as transport/sodium_gcm.py calls it (stop 29): AES-256-GCM
    sealed in place at a kept pointer (the sender), copied into a kept buffer and opened there (the
    receiver: the parser's own buffer moves, and taking its address per frame costs more than the copy), and AEGIS-256, a faster AEAD libsodium has that `cryptography` has not."""
    try:
        from nacl._sodium import ffi, lib
    except ImportError:
        return {}
    if lib.sodium_init() < 0 or lib.crypto_aead_aes256gcm_is_available() != 1:
        return {}
    n, null, nonce = len(plain), ffi.NULL, bytes(12)
    work = bytearray(plain) + bytearray(32)
    at = ffi.from_buffer(work)
    sealed = bytearray(n + 16)
    lib.crypto_aead_aes256gcm_encrypt(ffi.from_buffer(sealed), null, plain, n, ASSOCIATED, 8, null, nonce, key)
    frame = ASSOCIATED + bytes(sealed)  # as it lies in the parser's buffer
    kept = memoryview(bytearray(len(frame)))
    kept_at = ffi.from_buffer(kept)
    body_at = kept_at + len(ASSOCIATED)

    def open_kept():  # FrameOpener.open_kept: copied into a kept buffer, opened there at kept addresses
        kept[:] = frame
        return lib.crypto_aead_aes256gcm_decrypt(body_at, null, null, body_at, n + 16, kept_at, 8, nonce, key)
    assert open_kept() == 0
    aegis_nonce, aegis_out = bytes(32), bytearray(n + 32)
    aegis_at = ffi.from_buffer(aegis_out)
    return {
        "libsodium AES-256-GCM sealed in place, kept pointer (sodium_gcm)":
            lambda: lib.crypto_aead_aes256gcm_encrypt(at, null, at, n, ASSOCIATED, 8, null, nonce, key),
        "libsodium AES-256-GCM copied to a kept buffer, opened there (sodium_gcm)": open_kept,
        "libsodium AEGIS-256 encrypt, kept pointer":
            lambda: lib.crypto_aead_aegis256_encrypt(aegis_at, null, plain, n, ASSOCIATED, 8, null, aegis_nonce, key),
    }


def _composition_ways(key: bytes, plain: bytes, out: bytearray) -> dict:
    """The parts an encrypt-then-MAC of our own would run after a pass instead of one AEAD call (a keystream
    made ahead of time, XORed in, then a MAC over the result): each part's cold price alone. Measurement
    only (stop 29: the two together cost more than AES-GCM's one call, so none was built)."""
    import hashlib
    import hmac

    import numpy as np
    n = len(plain)
    keystream = np.frombuffer(os.urandom(n), np.uint8)
    source, target = np.frombuffer(plain, np.uint8), np.frombuffer(out, np.uint8)[:n]
    return {
        "XOR with a kept keystream (numpy, into a kept buffer)": lambda: np.bitwise_xor(source, keystream, out=target),
        "BLAKE2b keyed MAC, 16 B (hashlib)": lambda: hashlib.blake2b(out, key=key, digest_size=16).digest(),
        "HMAC-SHA256 (hmac.digest)": lambda: hmac.digest(key, out, "sha256"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--idle-ms", type=float, default=3.0)
    p.add_argument("--only", default="", help="comma-separated parts of candidate names to run (default: all)")
    args = p.parse_args()
    model, stage, hidden = middle_stage(args.model, args.layers)
    ways = candidates(4 * hidden)
    wanted = [w for w in args.only.split(",") if w]
    ways = {k: f for k, f in ways.items() if not wanted or any(w in k for w in wanted)}
    names = list(ways)
    for f in ways.values():  # once each: first-call setup out of the way
        f()
    after_pass: dict[str, list[float]] = {n: [] for n in names}
    after_idle: dict[str, list[float]] = {n: [] for n in names}
    warm: dict[str, list[float]] = {n: [] for n in names}
    after_pass_cpu: dict[str, list[float]] = {n: [] for n in names}  # on-CPU part: wall - CPU = not running
    pos = 150
    load_before = os.getloadavg()[0]
    for step in range(args.steps):
        name = names[step % len(names)]
        f = ways[name]
        x = mx.random.normal((1, 1, hidden))
        mx.eval(x)
        mx.eval(stage.forward("r", x, pos))
        pos += 1
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        f()
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        time.sleep(args.idle_ms / 1e3)
        t2 = time.perf_counter_ns()
        f()
        t3 = time.perf_counter_ns()
        f()
        t4 = time.perf_counter_ns()
        if step >= 2 * len(names):
            after_pass[name].append((t1 - t0) / 1e3)
            after_pass_cpu[name].append((c1 - c0) / 1e3)
            after_idle[name].append((t3 - t2) / 1e3)
            warm[name].append((t4 - t3) / 1e3)
    print(f"{model.model_id}: {4 * hidden} B frames, a {args.layers}-layer stage, {args.steps} steps, "
          f"idle {args.idle_ms} ms, OPENSSL_ia32cap={os.environ.get('OPENSSL_ia32cap', '(unset)')}, "
          f"1-min load {load_before:.1f} -> {os.getloadavg()[0]:.1f}; BLAS {blas_in_use()}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '(unset)')}, "
          f"OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT', '(unset)')}")
    print("| one call of | after a pass, µs (median) | its thread CPU time, µs | after idle, µs (median) | "
          "warm (the call again), µs |")
    print("|---|---:|---:|---:|---:|")
    for n in names:
        print(f"| {n} | {statistics.median(after_pass[n]):.1f} | {statistics.median(after_pass_cpu[n]):.1f} | "
              f"{statistics.median(after_idle[n]):.1f} | "
              f"{statistics.median(warm[n]):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
