"""The sealed wire format (sealed_frames.py), sans sockets: both shapes of a sealed frame round-trip, and
whatever is altered, replayed, reordered, cut or sent plain in place of one fails to open.

test_sealed_links.py does the same attacks over real links between nodes."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from swarm.transport import sodium_gcm
from swarm.transport.errors import ProtocolError
from swarm.transport.frames import PREFIX, FrameParser, encode_frame
from swarm.transport.link_crypto import TAG_BYTES, FrameOpener, FrameSealer
from swarm.transport.sealed_frames import JOIN_MAX_PAYLOAD, SealedFrameParser, read_sealed_frame, seal_frame

KEY = os.urandom(32)
MAX = 8 * 1024 * 1024
# empty, a decode step's hidden states, both sides of the boundary between the two shapes, a prefill chunk
SIZES = [0, 2304, JOIN_MAX_PAYLOAD, JOIN_MAX_PAYLOAD + 1, 1 << 20]


@pytest.fixture(autouse=True, params=["libsodium", "cryptography"])
def aead(request, monkeypatch) -> str:
    """Every test twice: a hop's frames sealed and opened by libsodium (sodium_gcm.py), then by
    `cryptography` alone (what a node without libsodium's AES-GCM runs). The helpers below seal the
    allocating way (`cryptography` always), so the parser also opens what the other one sealed."""
    if request.param == "libsodium" and not sodium_gcm.IN_USE:
        pytest.skip("libsodium's AES-GCM is not available on this machine")
    if request.param == "cryptography":
        monkeypatch.setattr(sodium_gcm, "IN_USE", False)
    return request.param


def header(i: int) -> dict:
    return {"t": "fwd", "r": "r-1", "at": i}


def sealed(sealer: FrameSealer, i: int, size: int) -> bytes:
    return sealed_with(sealer, i, os.urandom(size) if size else b"")


def sealed_with(sealer: FrameSealer, i: int, payload: bytes) -> bytes:
    return b"".join(bytes(p) for p in seal_frame(sealer, header(i), payload))


def fresh() -> tuple[FrameSealer, SealedFrameParser]:
    return FrameSealer(KEY), SealedFrameParser(FrameOpener(KEY), MAX)


@pytest.mark.parametrize("size", SIZES)
def test_frames_of_every_size_open_in_order_however_the_bytes_arrive(size) -> None:
    sealer, parser = fresh()
    payloads = [os.urandom(size) for _ in range(3)]
    wire = b"".join(b"".join(bytes(p) for p in seal_frame(sealer, header(i), payloads[i])) for i in range(3))
    assert len(wire) == 3 * (PREFIX.size + len(encode_frame(header(0))[0]) - PREFIX.size + size
                             + (TAG_BYTES if size <= JOIN_MAX_PAYLOAD else 2 * TAG_BYTES))
    step = max(1, len(wire) // 7)  # cut anywhere: mid-prefix, mid-tag, mid-payload
    got = []
    for at in range(0, len(wire), step):
        got += parser.feed(wire[at:at + step])
    assert [f.header for f in got] == [header(i) for i in range(3)]
    assert [bytes(f.payload) for f in got] == payloads
    assert not parser.mid_frame


@pytest.mark.parametrize("size", SIZES)
def test_every_altered_byte_fails_to_open(size) -> None:
    sealer = FrameSealer(KEY)
    frame = sealed(sealer, 0, size)
    # every byte of a small frame; for a large one the prefix, header, both tags and a sample of the payload
    spots = range(len(frame)) if len(frame) < 4096 else [*range(64), *range(len(frame) - 64, len(frame)),
                                                          *range(64, len(frame) - 64, 997)]
    for at in spots:
        altered = bytearray(frame)
        altered[at] ^= 0x01
        parser = SealedFrameParser(FrameOpener(KEY), MAX)
        try:
            frames = parser.feed(bytes(altered))
        except ProtocolError:
            continue
        # a flipped length bit may ask for more bytes than came: then the next bytes decide
        assert frames == [] and parser.mid_frame, f"byte {at} altered, the frame still opened"
        with pytest.raises(ProtocolError):
            parser.feed(sealed(FrameSealer(KEY), 1, size) + os.urandom(1 << 21))


@pytest.mark.parametrize("size", SIZES)
def test_a_replayed_or_reordered_frame_fails_to_open(size) -> None:
    sealer, parser = fresh()
    first, second = sealed(sealer, 0, size), sealed(sealer, 1, size)
    assert [f.header["at"] for f in parser.feed(first)] == [0]
    with pytest.raises(ProtocolError, match="did not open"):
        parser.feed(first)  # replayed
    _, parser = fresh()
    with pytest.raises(ProtocolError, match="did not open"):
        parser.feed(second)  # reordered (or the first one dropped)


@pytest.mark.parametrize("size", [0, 2304, JOIN_MAX_PAYLOAD + 1])
def test_a_plain_frame_in_place_of_a_sealed_one_is_read_whole_and_refused(size) -> None:
    _, parser = fresh()
    plain = b"".join(bytes(p) for p in encode_frame(header(0), os.urandom(size)))
    plain = plain + b"\0" * (2 * TAG_BYTES)  # as many bytes as a sealed frame of those lengths would have
    with pytest.raises(ProtocolError):
        parser.feed(plain)


def test_a_frame_whose_prefix_switches_shape_fails_to_open() -> None:
    """A joined frame re-labelled as split (and the reverse) by an attacker changing payload_len."""
    sealer, parser = fresh()
    frame = sealed(sealer, 0, JOIN_MAX_PAYLOAD - TAG_BYTES)
    header_len, payload_len = PREFIX.unpack_from(frame)
    relabelled = PREFIX.pack(header_len - TAG_BYTES, payload_len + TAG_BYTES) + frame[PREFIX.size:]
    with pytest.raises(ProtocolError):
        parser.feed(relabelled)


@pytest.mark.parametrize("lengths", [(TAG_BYTES, 0), (0, 10), (100, JOIN_MAX_PAYLOAD + 1),
                                     (100, JOIN_MAX_PAYLOAD + TAG_BYTES), (100, MAX + 2 * TAG_BYTES),
                                     (64 * 1024 + TAG_BYTES + 1, 0)])
def test_lengths_no_sealed_frame_has_are_refused_before_reading_on(lengths) -> None:
    _, parser = fresh()
    with pytest.raises(ProtocolError):
        parser.feed(PREFIX.pack(*lengths))


def test_the_plain_parser_and_the_sealed_one_share_their_loop() -> None:
    """One loop (frames.FrameParser.feed): max_frames and take_rest work on both."""
    sealer, parser = fresh()
    wire = b"".join(sealed(sealer, i, 2304) for i in range(3))
    assert [f.header["at"] for f in parser.feed(wire, max_frames=2)] == [0, 1]
    assert [f.header["at"] for f in parser.feed(b"")] == [2]
    plain = FrameParser(MAX)
    assert len(plain.feed(b"".join(bytes(p) for p in encode_frame(header(0), b"x")) * 2, max_frames=1)) == 1
    assert plain.mid_frame and plain.take_rest()


@pytest.mark.parametrize("size", SIZES)
def test_the_stream_reader_opens_the_same_frames_and_refuses_the_same_attacks(size) -> None:
    async def read_all(data: bytes, n: int):
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        opener = FrameOpener(KEY)
        return [await read_sealed_frame(reader, opener, MAX) for _ in range(n)]

    sealer = FrameSealer(KEY)
    first, second = sealed(sealer, 0, size), sealed(sealer, 1, size)
    got = asyncio.run(read_all(first + second, 2))
    assert [f.header["at"] for f in got] == [0, 1] and len(got[1].payload) == size
    for attack in (first + first, second, first[:-1] + bytes([first[-1] ^ 1])):
        with pytest.raises(ProtocolError):
            asyncio.run(read_all(attack, 2))


@pytest.mark.parametrize("size", SIZES)
def test_the_thread_link_sends_and_reads_both_shapes_and_refuses_a_replay(size, tmp_path) -> None:
    """thread_link.py (weights off the event loop) speaks the same sealed frames over a real socket."""
    import socket
    import threading

    from swarm.transport.link_handshake import LinkCipher
    from swarm.transport.thread_link import ThreadFrameLink

    a, b = socket.socketpair()
    sender = ThreadFrameLink("b", a, MAX, cipher=LinkCipher(FrameSealer(KEY), FrameOpener(os.urandom(32))))
    receiver = ThreadFrameLink("a", b, MAX, cipher=LinkCipher(FrameSealer(os.urandom(32)), FrameOpener(KEY)))
    data = os.urandom(size)
    (tmp_path / "chunk").write_bytes(data)
    recorded: list[bytes] = []

    def send() -> None:
        sender.send(header(0), data)
        with open(tmp_path / "chunk", "rb") as f:
            sender.send_file(header(1), f, 0, size, bytearray(size))

    thread = threading.Thread(target=send)
    thread.start()
    frame = receiver.receive()
    assert frame.header == header(0) and bytes(frame.payload) == data
    got_header, n = receiver.receive_header()
    assert got_header == header(1) and n == size
    assert bytes(receiver.receive_payload_into(bytearray(n))) == data
    thread.join()
    # the same bytes again: the counter has moved on, they do not open
    replay_sealer = FrameSealer(KEY)
    recorded.append(b"".join(bytes(p) for p in seal_frame(replay_sealer, header(0), data)))
    def send_replay() -> None:  # on a thread: a MB does not fit the socket's buffer
        with contextlib.suppress(OSError):  # cut off by the receiver's abort below
            a.sendall(recorded[0])

    thread = threading.Thread(target=send_replay)
    thread.start()
    with pytest.raises(ProtocolError, match="did not open"):
        receiver.receive()
    receiver.abort()
    thread.join()
    sender.close()
    receiver.close()


@pytest.mark.parametrize("tamper", [False, True])
def test_a_large_payload_opens_a_piece_at_a_time_and_is_refused_at_its_end_if_altered(tamper) -> None:
    """Weights: what one AEAD call sealed opens piece by piece (and what send_file seals so, above, opens
    whole); an altered byte surfaces as a ProtocolError once the last piece is in, before the caller
    could keep any of it."""
    import socket
    import threading

    from swarm.transport.link_handshake import LinkCipher
    from swarm.transport.thread_link import ThreadFrameLink

    a, b = socket.socketpair()
    receiver = ThreadFrameLink("a", b, MAX, cipher=LinkCipher(FrameSealer(os.urandom(32)), FrameOpener(KEY)))
    data = os.urandom(300_000)
    wire = bytearray(b"".join(bytes(p) for p in seal_frame(FrameSealer(KEY), header(0), data)))
    if tamper:
        wire[-1000] ^= 1
    thread = threading.Thread(target=a.sendall, args=(bytes(wire),))
    thread.start()
    assert receiver.receive_header() == (header(0), len(data))
    got = bytearray()
    pieces = receiver.receive_payload_in_pieces(bytearray(64 * 1024))
    if tamper:
        with pytest.raises(ProtocolError, match="did not open"):
            for piece in pieces:
                got += piece
        assert len(got) == len(data)  # every piece was handed out; only the end says they are not authentic
    else:
        for piece in pieces:
            assert len(piece) <= 64 * 1024
            got += piece
        assert bytes(got) == data
    thread.join()
    receiver.close()
    a.close()


@pytest.mark.parametrize("size", [0, 2304, JOIN_MAX_PAYLOAD])
def test_a_hops_frames_sealed_in_place_are_the_allocating_seals_bytes_and_open_everywhere(size) -> None:
    """seal_frame(reuse=True), the data lane's (libsodium's when it can), against the allocating seal
    (`cryptography`'s): the same bytes, frame after frame; opened by the parser (FrameOpener.open_kept)
    and by the stream reader (`cryptography`'s open)."""
    in_place, allocating = FrameSealer(KEY), FrameSealer(KEY)
    payloads = [os.urandom(size) for _ in range(3)]
    wire = b""
    for i, payload in enumerate(payloads):
        frame = b"".join(bytes(p) for p in seal_frame(in_place, header(i), memoryview(payload), reuse=True))
        assert frame == sealed_with(allocating, i, payload)
        wire += frame
    _, parser = fresh()
    assert [(f.header, bytes(f.payload)) for f in parser.feed(wire)] == list(zip(map(header, range(3)), payloads))

    async def read_all() -> list:
        reader = asyncio.StreamReader()
        reader.feed_data(wire)
        opener = FrameOpener(KEY)
        return [await read_sealed_frame(reader, opener, MAX) for _ in range(3)]
    assert [bytes(f.payload) for f in asyncio.run(read_all())] == payloads
