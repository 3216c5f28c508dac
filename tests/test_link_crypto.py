"""The peer link's cryptography: proofs of the swarm secret, per-direction keys, sealed frames."""

from __future__ import annotations

import os
import platform

import pytest

from swarm.transport import sodium_gcm
from swarm.transport.link_crypto import (
    FrameOpener,
    FrameSealer,
    LinkAuthError,
    Transcript,
    check_proof,
    link_keys,
    new_nonce,
    proof,
    stretch_secret,
)

KEY = stretch_secret("correct horse battery staple")


def transcript(**changes) -> Transcript:
    base = dict(version=2, swarm="home", client_id="a", server_id="b",
                client_nonce=b"c" * 32, server_nonce=b"s" * 32)
    return Transcript(**{**base, **changes})


def test_each_side_accepts_the_others_proof():
    t = transcript(client_nonce=new_nonce(), server_nonce=new_nonce())
    check_proof(KEY, "server", t, proof(KEY, "server", t))
    check_proof(KEY, "client", t, proof(KEY, "client", t))


@pytest.mark.parametrize("change", [
    {"client_nonce": b"C" * 32}, {"server_nonce": b"S" * 32}, {"swarm": "other"},
    {"client_id": "x"}, {"server_id": "x"}, {"version": 3},
])
def test_a_proof_is_good_for_its_own_transcript_only(change):
    # A recorded handshake replayed against a fresh nonce (or another swarm or node) fails.
    with pytest.raises(LinkAuthError):
        check_proof(KEY, "client", transcript(**change), proof(KEY, "client", transcript()))


def test_a_wrong_secret_or_role_fails():
    t = transcript()
    with pytest.raises(LinkAuthError):
        check_proof(KEY, "client", t, proof(stretch_secret("guess"), "client", t))
    with pytest.raises(LinkAuthError):  # the server's proof cannot be used to pass as a client
        check_proof(KEY, "client", t, proof(KEY, "server", t))
    with pytest.raises(LinkAuthError):
        check_proof(KEY, "client", t, None)


def test_bad_nonces_are_refused():
    with pytest.raises(LinkAuthError):
        transcript(client_nonce=b"short")
    with pytest.raises(LinkAuthError):
        transcript(server_nonce="not bytes")


def test_keys_pair_up_across_the_link_and_differ_per_direction_and_connection():
    t = transcript()
    client, server = link_keys(KEY, "client", t), link_keys(KEY, "server", t)
    assert client.send == server.receive and client.receive == server.send
    assert client.send != client.receive
    assert link_keys(KEY, "client", transcript(server_nonce=b"x" * 32)).send != client.send


def link():
    keys = link_keys(KEY, "client", transcript())
    return FrameSealer(keys.send), FrameOpener(link_keys(KEY, "server", transcript()).receive)


def test_frames_open_in_order():
    sealer, opener = link()
    for i in range(5):
        body = bytes([i]) * (100 * i)
        assert opener.open(b"prefix", sealer.seal(b"prefix", body)) == body


def test_replayed_reordered_or_altered_frames_do_not_open():
    sealer, opener = link()
    first, second = sealer.seal(b"p", b"one"), sealer.seal(b"p", b"two")
    assert opener.open(b"p", first) == b"one"
    with pytest.raises(LinkAuthError):
        opener.open(b"p", first)  # replayed
    sealer, opener = link()
    first, second = sealer.seal(b"p", b"one"), sealer.seal(b"p", b"two")
    with pytest.raises(LinkAuthError):
        opener.open(b"p", second)  # reordered (or the first one dropped)
    sealer, opener = link()
    sealed = bytearray(sealer.seal(b"p", b"payload"))
    sealed[0] ^= 1
    with pytest.raises(LinkAuthError):
        opener.open(b"p", bytes(sealed))  # altered body
    sealer, opener = link()
    with pytest.raises(LinkAuthError):
        opener.open(b"q", sealer.seal(b"p", b"payload"))  # altered length prefix


def test_a_hops_frames_are_sealed_and_opened_by_libsodium_here():
    """The fast path is in use where the guide's machines run (x86-64 with AES-NI and PCLMUL):
    PyNaCl installed, its bundled libsodium's AES-256-GCM available (sodium_gcm.py)."""
    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    if platform.machine() != "x86_64" or "aes" not in flags or "pclmulqdq" not in flags:
        pytest.skip("not an x86-64 machine with AES-NI and PCLMUL")
    if os.environ.get("SWARM_SODIUM", "").lower() == "off":
        pytest.skip("SWARM_SODIUM=off turns it off")
    assert sodium_gcm.IN_USE


@pytest.mark.parametrize("sender,receiver", [("libsodium", "cryptography"), ("cryptography", "libsodium")])
def test_libsodium_and_cryptography_open_each_others_frames_and_refuse_the_same_attacks(sender, receiver,
                                                                                          monkeypatch):
    """Nodes with and without libsodium's AES-GCM talk to each other: the same cipher, the same bytes."""
    if not sodium_gcm.IN_USE:
        pytest.skip("libsodium's AES-GCM is not available on this machine")

    def use(implementation: str) -> None:
        monkeypatch.setattr(sodium_gcm, "IN_USE", implementation == "libsodium")

    def wire(sealer: FrameSealer, body: bytes) -> bytearray:
        use(sender)
        prefix = len(body).to_bytes(8, "big")
        return bytearray(prefix + bytes(sealer.seal_into(prefix, body[:10], memoryview(body[10:]))))

    def opens(opener: FrameOpener, frame: bytearray) -> bytes:
        use(receiver)
        return bytes(opener.open_kept(memoryview(frame), 8))

    sealer, opener = link()
    bodies = [os.urandom(n) for n in (10, 100, 2304, 40_000)]
    for body in bodies:
        assert opens(opener, wire(sealer, body)) == body
    sealer, opener = link()
    first, second = bytes(wire(sealer, bodies[1])), bytes(wire(sealer, bodies[2]))
    for attack in (second,  # reordered (the first one dropped)
                   first[:20] + bytes([first[20] ^ 1]) + first[21:],  # altered body
                   bytes([first[0] ^ 1]) + first[1:],  # altered prefix (the associated data)
                   first[:-1] + bytes([first[-1] ^ 1])):  # altered tag
        with pytest.raises(LinkAuthError):
            opens(opener, bytearray(attack))
    assert opens(opener, bytearray(first)) == bodies[1]
    with pytest.raises(LinkAuthError):
        opens(opener, bytearray(first))  # replayed


def test_an_empty_secret_is_refused():
    with pytest.raises(ValueError):
        stretch_secret("")
