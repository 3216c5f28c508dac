"""The peer protocol over real loopback sockets: frames, arrays, the listener and handshake, hostile input.

Sending and receiving go through the data lane (transport/lane.py) as in a node; see also test_lane.py."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time

import mlx.core as mx
import msgpack
import pytest

from discovery.profile import NodeProfile
from discovery.profile_exchange import fetch_profile
from helpers import eventually
from peer_nodes import HOST, SWARM, PeerNode, established_to, frame_bytes, hello_bytes, token, transport_warnings
from swarm.bench.cluster import free_port
from swarm.transport.arrays import decode_array, encode_array
from swarm.transport.errors import PeerUnreachable, ProtocolError
from swarm.transport.frames import MAGIC, read_frame
from swarm.transport.messages import Forward, Token

pytestmark = pytest.mark.timeout(30)

MAX_PAYLOAD = 1024 * 1024
PREFIX = struct.Struct(">II")


@pytest.fixture
async def pair():
    """(receiver, sender): two started nodes' data paths that know each other's address."""
    addresses: dict[str, tuple[str, int]] = {}
    receiver = await PeerNode("node-a", addresses, max_payload=MAX_PAYLOAD).start()
    sender = await PeerNode("node-b", addresses, max_payload=MAX_PAYLOAD).start()
    yield receiver, sender
    await sender.stop()
    await receiver.stop()


def raw_frame(packed_header: bytes, payload: bytes = b"") -> bytes:
    return PREFIX.pack(len(packed_header), len(payload)) + packed_header + payload


def reader_with(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def raw_session(port: int, data: bytes, *, close_write: bool = False, timeout: float = 2.0) -> bytes:
    """Send `data` on a fresh connection; everything the server sent until it closed (or reset) it.

    Times out (failing the test) if the server keeps the connection open.
    """
    reader, writer = await asyncio.open_connection(HOST, port)
    got = b""

    async def until_closed() -> None:
        nonlocal got
        while chunk := await reader.read(65536):
            got += chunk

    try:
        writer.write(data)
        await writer.drain()
        if close_write:
            writer.write_eof()
        await asyncio.wait_for(until_closed(), timeout)
    except ConnectionResetError:
        pass  # a link that broke is closed with a reset
    finally:
        writer.close()
    return got


# -- frames and arrays, no sockets --------------------------------------------
async def test_frame_round_trip_keeps_header_and_payload() -> None:
    header = {"t": "activations", "req": "r-1", "pos": 17, "nested": {"a": [1, 2.5, None]}, "blob": b"\x00\xff", "ü": "ö"}
    payload = bytes(range(256)) * 3
    frame = await read_frame(reader_with(frame_bytes(header, payload)))
    assert frame.header == header and frame.payload == payload and frame.type == "activations"


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("bad msgpack", raw_frame(b"\xc1\xc1\xc1")),
        ("non-dict header", raw_frame(msgpack.packb(["t", "hello"]))),
        ("missing t", raw_frame(msgpack.packb({"type": "x"}))),
        ("non-str t", raw_frame(msgpack.packb({"t": 5}))),
        ("int map key", raw_frame(msgpack.packb({1: "x", "t": "x"}))),
        ("ext type", raw_frame(msgpack.packb({"t": "x", "e": msgpack.ExtType(1, b"evil")}))),
        ("truncated prefix", PREFIX.pack(5, 0)[:6]),
        ("truncated header", raw_frame(msgpack.packb({"t": "x"}))[:-1]),
        ("truncated payload", raw_frame(msgpack.packb({"t": "x"}), b"abcdef")[:-2]),
    ],
)
async def test_read_frame_rejects_malformed_input(name: str, data: bytes) -> None:
    with pytest.raises(ProtocolError):
        await read_frame(reader_with(data))


@pytest.mark.parametrize("lengths", [(64 * 1024 + 1, 0), (10, MAX_PAYLOAD + 1), (2**32 - 1, 2**32 - 1)])
async def test_oversized_lengths_are_rejected_before_reading(lengths: tuple[int, int]) -> None:
    # No EOF and no body: a reader that tried to read the body would wait forever.
    reader = reader_with(PREFIX.pack(*lengths), eof=False)
    with pytest.raises(ProtocolError, match="max"):
        await asyncio.wait_for(read_frame(reader, MAX_PAYLOAD), 1.0)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16, mx.int32])
def test_array_round_trip_is_exact(dtype: mx.Dtype) -> None:
    a = (mx.random.normal((1, 5, 7)) * 100).astype(dtype)
    name, shape, data = encode_array(a)
    b = decode_array(name, shape, bytes(data))
    assert b.dtype == dtype and b.shape == a.shape and mx.array_equal(a, b).item()


def test_non_contiguous_array_is_sent_in_logical_order() -> None:
    a = mx.transpose(mx.arange(12, dtype=mx.float32).reshape(3, 4))
    assert mx.array_equal(decode_array(*encode_array(a)), a).item()


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [
        ("float32", [2, 3], 23),  # one byte short
        ("float32", [2, 3], 28),
        ("float64", [1], 8),  # not on the allow-list
        ("object", [1], 8),
        (None, [1], 4),
        ("float32", "2,3", 24),
        ("float32", [2, -3], 24),
        ("float32", [True, 4], 16),
        ("float32", [1] * 9, 4),
    ],
)
def test_decode_array_rejects_inconsistent_descriptions(dtype, shape, nbytes: int) -> None:
    with pytest.raises(ProtocolError):
        decode_array(dtype, shape, b"\x00" * nbytes)


def test_large_activation_round_trips_fast() -> None:
    a = mx.random.normal((1, 2048, 576))
    mx.eval(a)
    best = float("inf")
    for _ in range(5):  # best of 5: what the code costs, not what the scheduler did
        start = time.perf_counter()
        name, shape, data = encode_array(a)
        b = decode_array(name, shape, bytes(data))  # bytes: as it arrives off the socket
        mx.eval(b)
        best = min(best, time.perf_counter() - start)
    assert best < 0.010, f"{best * 1e3:.1f} ms"
    assert mx.array_equal(a, b).item()


def test_unsupported_dtype_cannot_be_sent() -> None:
    with pytest.raises(ValueError):
        encode_array(mx.zeros((2,), dtype=mx.int64))


# -- two nodes ---------------------------------------------------------------
def hidden_states(a: mx.array, seq: int = 0) -> Forward:
    """A forward into a later stage (start 1) carrying `a` ([1, L, H]); int32 only into stage 0."""
    if a.dtype == mx.int32:
        return Forward.of_tokens("r1", "p1", seq, "node-b", None, a.reshape(-1).tolist())
    dtype, shape, data = encode_array(a)
    return Forward("r1", "p1", seq, 1, "node-b", None, dtype, tuple(shape), bytes(data))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16, mx.int32])
async def test_arrays_travel_between_nodes(pair, dtype: mx.Dtype) -> None:
    receiver, sender = pair
    a = (mx.random.normal((1, 3, 16)) * 50).astype(dtype)
    if dtype == mx.int32:
        a = mx.abs(a).reshape(1, -1)
    await sender.send("node-a", hidden_states(a))
    [(from_node, message)] = await receiver.received_async(1)
    assert from_node == "node-b" and message.rid == "r1"
    b = message.array()
    assert b.dtype == dtype and mx.array_equal(a, b).item()


async def test_thousand_frames_arrive_in_order(pair) -> None:
    receiver, sender = pair
    for seq in range(1000):
        n = seq % 7 + 1
        a = mx.full((1, n, 4), float(seq))
        await sender.send("node-a", hidden_states(a, seq))
    got = await receiver.received_async(1000)
    assert [m.pos for _, m in got] == list(range(1000))
    assert all(m.array().shape == (1, s % 7 + 1, 4) and m.array()[0, 0, 0].item() == s for s, (_, m) in enumerate(got))


async def test_concurrent_sends_never_interleave_frames(pair) -> None:
    receiver, sender = pair
    sizes = [1, 17_500, 3, 75_000, 1, 30_864] * 20  # hidden-state floats: up to 300 KB a frame
    await asyncio.gather(*(sender.send("node-a", hidden_states(mx.full((1, n, 1), float(i % 256)), i))
                           for i, n in enumerate(sizes)))
    got = await receiver.received_async(len(sizes))
    assert sorted(m.pos for _, m in got) == list(range(len(sizes)))
    for _, m in got:
        a = m.array()
        assert a.shape == (1, sizes[m.pos], 1) and mx.all(a == float(m.pos % 256)).item()


async def test_replies_travel_on_the_same_connection(pair) -> None:
    """One connection per pair of peers, used in both directions: the reply takes the request's."""
    receiver, sender = pair
    await sender.send("node-a", token(0))
    await receiver.received_async(1)
    await receiver.send("node-b", token(1))
    [(from_node, message)] = await sender.received_async(1)
    assert from_node == "node-a" and message.at == 2
    out, back = sender.links.link("node-a"), receiver.links.link("node-b")
    assert out.dialed and not back.dialed
    assert out.sock.getsockname() == back.sock.getpeername()
    assert established_to(sender.port, receiver.port) == 1


async def test_unknown_message_types_are_refused_by_name(pair, caplog) -> None:
    receiver, sender = pair
    await sender.send("node-a", token(0))
    await receiver.received_async(1)
    good = sender.links.link("node-a")
    caplog.clear()
    reply = await raw_session(receiver.port, MAGIC + hello_bytes("raw-client") + frame_bytes({"t": "from-the-future"}))
    assert Token.T not in reply.decode(errors="replace")
    [warning] = transport_warnings(caplog)
    assert "from-the-future" in warning and "unknown message type" in warning
    await sender.send("node-a", token(1))
    [(_, message)] = await receiver.received_async(1)
    assert message.at == 2 and sender.links.link("node-a") is good


async def test_sockets_have_nodelay(pair) -> None:
    receiver, sender = pair
    await sender.send("node-a", token(0))
    await receiver.received_async(1)
    for sock in (sender.links.link("node-a").sock, receiver.links.link("node-b").sock):
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


# -- hostile input on the peer port -------------------------------------------
HELLO = hello_bytes("raw-client")


@pytest.mark.parametrize(
    ("name", "data", "close_write", "error_kind"),
    [
        ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", False, None),
        ("three bytes", b"SWR", True, None),
        ("magic then garbage", MAGIC + raw_frame(b"\xc1\xc1\xc1\xc1"), False, None),
        ("non-dict hello", MAGIC + raw_frame(msgpack.packb([1, 2, 3])), False, None),
        ("hello with payload", MAGIC + frame_bytes({"t": "hello", "v": 1, "node_id": "raw-client", "swarm": SWARM},
                                                   b"xx"), False, None),
        ("not a hello", MAGIC + frame_bytes({"t": "activations"}), False, "protocol"),
        ("wrong version", MAGIC + frame_bytes({"t": "hello", "v": 99, "node_id": "raw-client", "swarm": SWARM}),
         False, "version"),
        ("wrong swarm", MAGIC + hello_bytes("raw-client", "other-swarm"), False, "swarm"),
        ("truncated frame", MAGIC + HELLO + raw_frame(msgpack.packb({"t": "x"}), b"abcdef")[:-3], True, None),
        ("huge header length", MAGIC + HELLO + PREFIX.pack(2**32 - 1, 0), False, None),
        ("huge payload length", MAGIC + HELLO + PREFIX.pack(10, MAX_PAYLOAD + 1), False, None),
        ("non-dict header", MAGIC + HELLO + raw_frame(msgpack.packb("t")), False, None),
        ("ext type header", MAGIC + HELLO + raw_frame(msgpack.packb({"t": msgpack.ExtType(7, b"")})), False, None),
        ("malformed message", MAGIC + HELLO + frame_bytes({"t": "tok", "rid": "r", "plan": "p", "at": -1,
                                                           "token": 1, "cu": 0}), False, None),
    ],
)
async def test_hostile_connection_is_closed_alone(pair, caplog, name, data, close_write, error_kind) -> None:
    receiver, sender = pair
    await sender.send("node-a", token(0))
    await receiver.received_async(1)
    good_connection = sender.links.link("node-a")
    caplog.clear()

    # Closed by the server without us closing first (the "huge" cases send no body).
    reply = await raw_session(receiver.port, data, close_write=close_write)

    if error_kind is not None:
        error = await read_frame(reader_with(reply))
        assert error.header["t"] == "error" and error.header["kind"] == error_kind
    assert len(transport_warnings(caplog)) == 1, transport_warnings(caplog)
    await sender.send("node-a", token(1))
    got = [m.at for _, m in await receiver.received_async(1)]
    assert got == [2] and receiver.nothing_received()
    assert sender.links.link("node-a") is good_connection  # never disturbed


async def test_liveness_probe_leaves_no_warning(pair, caplog) -> None:
    receiver, _ = pair
    caplog.set_level(logging.DEBUG, logger="swarm.transport")
    _, writer = await asyncio.open_connection(HOST, receiver.port)  # connect and close: a bare probe
    writer.close()
    await asyncio.sleep(0.1)  # let the server see the close
    assert transport_warnings(caplog) == []
    assert any("liveness" in r.getMessage() for r in caplog.records)


async def test_profile_request_is_answered() -> None:
    profile = NodeProfile(node_id="node-p", name="p", swarm=SWARM, api_port=8000, peer_port=9000, speed=0.5)
    node = await PeerNode("node-p", {}, profile=profile).start()
    try:
        assert await fetch_profile(HOST, node.port) == profile
    finally:
        await node.stop()


async def test_handler_failure_closes_only_that_connection(caplog) -> None:
    addresses: dict[str, tuple[str, int]] = {}
    got = []

    def fragile(sender_id: str, message) -> None:
        if message.token == 666:
            raise RuntimeError("handler bug")
        got.append(message)

    receiver = await PeerNode("node-a", addresses, on_message=fragile).start()
    sender = await PeerNode("node-b", addresses).start()
    try:
        await sender.send("node-a", Token("r1", "p1", 1, 666))
        first = sender.links.link("node-a")  # None already if the sender saw the close while send returned
        await eventually(lambda: any("handler bug" in w for w in transport_warnings(caplog)))
        await eventually(lambda: first is None or first.peer_gone())  # the sender sees the close: next send reconnects
        await sender.send("node-a", Token("r1", "p1", 2, 7))
        await eventually(lambda: [m.token for m in got] == [7])
        assert sender.links.link("node-a") is not first
    finally:
        await sender.stop()
        await receiver.stop()


# -- reaching peers -----------------------------------------------------------
async def test_send_to_dead_port_raises_peer_unreachable() -> None:
    sender = await PeerNode("node-b", {"node-x": (HOST, free_port())}, connect_timeout=0.5).start()
    try:
        start = time.monotonic()
        with pytest.raises(PeerUnreachable) as info:
            await sender.send("node-x", token(0))
        assert info.value.node_id == "node-x" and time.monotonic() - start < 0.5 + 0.5
    finally:
        await sender.stop()


async def test_send_to_silent_listener_times_out() -> None:
    # Accepts but never says hello back: the connect timeout covers the handshake.
    server = await asyncio.start_server(lambda r, w: None, HOST, 0)
    sender = await PeerNode("node-b", {"node-x": (HOST, server.sockets[0].getsockname()[1])},
                            connect_timeout=0.3).start()
    try:
        start = time.monotonic()
        with pytest.raises(PeerUnreachable, match="within"):
            await sender.send("node-x", token(0))
        assert time.monotonic() - start < 0.3 + 0.5
    finally:
        await sender.stop()
        server.close()


async def test_send_to_wrong_node_or_swarm_is_refused(pair) -> None:
    receiver, sender = pair
    sender.addresses["node-z"] = sender.addresses["node-a"]
    with pytest.raises(PeerUnreachable, match="node"):
        await sender.send("node-z", token(0))
    stranger = await PeerNode("node-s", dict(sender.addresses), swarm="other-swarm").start()
    try:
        with pytest.raises(PeerUnreachable, match="swarm"):
            await stranger.send("node-a", token(0))
    finally:
        await stranger.stop()
    await asyncio.sleep(0.1)
    assert receiver.nothing_received()


async def test_send_reconnects_after_peer_restart() -> None:
    addresses: dict[str, tuple[str, int]] = {}
    receiver = await PeerNode("node-a", addresses).start()
    sender = await PeerNode("node-b", addresses).start()
    port = receiver.port
    try:
        await sender.send("node-a", token(0))
        await receiver.stop()
        with pytest.raises(PeerUnreachable):
            await sender.send("node-a", token(1))
        receiver = await PeerNode("node-a", addresses, port=port).start()
        await sender.send("node-a", token(2))
        [(_, message)] = await receiver.received_async(1)
        assert message.at == 3
    finally:
        await sender.stop()
        await receiver.stop()


async def test_drop_closes_and_next_send_reconnects(pair) -> None:
    receiver, sender = pair
    await sender.send("node-a", token(0))
    first = sender.links.link("node-a")
    await sender.worker.run(sender.lane.mlx_drop, "node-a")
    assert first.sock.fileno() == -1 and sender.links.link("node-a") is None
    await sender.send("node-a", token(1))
    assert len(await receiver.received_async(2)) == 2
