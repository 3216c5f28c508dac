"""Peer links with a swarm secret over real loopback sockets: proved hellos, sealed frames, refusals said once.

See test_transport.py and test_lane.py for the open protocol; the same data lane runs here with a key."""

from __future__ import annotations

import asyncio
import socket

import mlx.core as mx
import pytest

from discovery.profile import NodeProfile
from discovery.profile_exchange import ProfileExchangeError
from helpers import eventually
from peer_nodes import HOST, SWARM, PeerNode, frame_bytes, hello_bytes, token, transport_warnings
from swarm.transport.arrays import encode_array
from swarm.transport.connection_budget import ConnectionBudget
from swarm.transport.errors import HandshakeRejected, PeerUnreachable
from swarm.transport.frames import MAGIC
from swarm.transport.handshake import dial, dial_stream
from swarm.transport.link_crypto import FrameSealer, stretch_secret
from swarm.transport.link_handshake import LinkAuth
from swarm.transport.messages import Forward
from swarm.transport.peer_profiles import ProfileFetcher
from swarm.transport.sealed_frames import seal_frame

pytestmark = pytest.mark.timeout(60)

KEY = stretch_secret("a test secret, long enough 9d2e")
OTHER_KEY = stretch_secret("another secret altogether 51aa")


@pytest.fixture
async def sealed_pair():
    addresses: dict[str, tuple[str, int]] = {}
    a = await PeerNode("node-a", addresses, key=KEY).start()
    b = await PeerNode("node-b", addresses, key=KEY).start()
    yield a, b
    await b.stop()
    await a.stop()


def profile_of(node_id: str, port: int) -> NodeProfile:
    return NodeProfile(node_id=node_id, name=node_id, swarm=SWARM, api_port=1, peer_port=port, speed=0.01,
                       instance="i-" + node_id)


async def test_messages_travel_sealed_both_ways_in_order(sealed_pair) -> None:
    a, b = sealed_pair
    big = mx.random.normal((1, 2048, 576))  # a long prompt's activations, 4.7 MB
    dtype, shape, data = encode_array(big)
    await a.send("node-b", Forward("r1", "p1", 0, 1, "node-a", None, dtype, tuple(shape), data))
    for i in range(50):
        await a.send("node-b", token(i))
        await b.send("node-a", token(i))
    got_b, got_a = await b.received_async(51), await a.received_async(50)
    assert mx.array_equal(got_b[0][1].array(), big).item()
    assert [m.at for _, m in got_b[1:]] == [m.at for _, m in got_a] == list(range(1, 51))
    assert {s for s, _ in got_b} == {"node-a"} and {s for s, _ in got_a} == {"node-b"}
    assert a.links.link("node-b").sealed and b.links.link("node-a").sealed


@pytest.mark.parametrize("keys", [(KEY, None), (None, KEY), (KEY, OTHER_KEY)], ids=["dialer", "answerer", "other"])
async def test_nodes_with_different_secrets_never_connect_and_say_why_once(keys, caplog) -> None:
    addresses: dict[str, tuple[str, int]] = {}
    a = await PeerNode("node-a", addresses, key=keys[0]).start()
    b = await PeerNode("node-b", addresses, key=keys[1]).start()
    try:
        for i in range(5):
            with pytest.raises(PeerUnreachable, match="auth"):
                await a.send("node-b", token(i))
        assert b.nothing_received() and not a.links.all() and not b.links.all()
        warnings = transport_warnings(caplog)
        print(*warnings, sep="\n")
        mine = [w for w in warnings if "our hello" in w]
        theirs = [w for w in warnings if "refused a hello" in w]
        assert len(mine) == 1 and len(theirs) == 1, warnings  # once each, for five attempts
        assert "secret" in mine[0] and "secret" in theirs[0]
    finally:
        await b.stop()
        await a.stop()


def raw_session(port: int, data: bytes, wait: float = 3.0) -> bytes:
    with socket.create_connection((HOST, port), timeout=5) as s:
        s.sendall(data)
        s.settimeout(wait)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return got


async def test_a_hello_without_the_secret_is_refused_and_its_frames_ignored(sealed_pair) -> None:
    a, b = sealed_pair
    frames = hello_bytes("stranger") + b"".join(seal_frame(FrameSealer(b"k" * 32), *token(0).to_frame()))
    answer = await asyncio.to_thread(raw_session, b.port, MAGIC + frames)
    assert b"error" in answer and b"auth" in answer and b"node-b" not in answer  # refused before it said who
    assert b.nothing_received() and not b.links.all()


def authenticated_connection(node: PeerNode, key: bytes, me: str = "node-x"):
    return dial((HOST, node.port), LinkAuth(me, SWARM, key), node.node_id, 5.0, 1 << 20)


@pytest.mark.parametrize("attack", ["flip", "replay", "reorder", "plain"])
async def test_an_altered_replayed_or_reordered_frame_closes_that_link_only(sealed_pair, attack, caplog) -> None:
    a, b = sealed_pair
    await a.send("node-b", token(0))
    await b.received_async(1)
    honest = a.links.link("node-b")
    conn = await asyncio.to_thread(authenticated_connection, b, KEY)  # a peer that knows the secret
    await eventually(lambda: b.links.link("node-x") is not None)
    first = b"".join(seal_frame(conn._sealer, *token(1).to_frame()))
    second = b"".join(seal_frame(conn._sealer, *token(2).to_frame()))
    sent = {"flip": first[:-1] + bytes([first[-1] ^ 1]), "replay": first + first, "reorder": second,
            "plain": frame_bytes(*token(1).to_frame())}[attack]
    conn.sock.setblocking(True)
    conn.sock.sendall(sent)
    await eventually(lambda: b.links.link("node-x") is None)
    # (a replay's first copy is the frame itself; read together with its copy, it goes with the link)
    assert [m.at for _, m in b.received(len(b.inbox.queue), 1)] in ([], [2])
    assert any("did not open" in w for w in transport_warnings(caplog)), transport_warnings(caplog)
    conn.sock.settimeout(5)
    with pytest.raises(ConnectionResetError):  # a break, not a clean end: the peer knows frames were lost
        while conn.sock.recv(65536):
            pass
    conn.close()
    await a.send("node-b", token(3))  # the honest link never noticed
    [(_, message)] = await b.received_async(1)
    assert message.at == 4 and a.links.link("node-b") is honest


async def test_a_broken_link_is_reported_and_a_clean_one_is_not(caplog) -> None:
    addresses: dict[str, tuple[str, int]] = {}
    broken: list[tuple[str, str]] = []
    b = await PeerNode("node-b", addresses, key=KEY, on_broken=lambda peer, why: broken.append((peer, why))).start()
    try:
        conn = await asyncio.to_thread(authenticated_connection, b, KEY, "node-x")
        await eventually(lambda: b.links.link("node-x") is not None)
        conn.sock.setblocking(True)
        conn.sock.sendall(b"\x00\x00\x00\x20\x00\x00\x00\x00" + b"\x01" * 32)  # a frame that does not open
        await eventually(lambda: broken)
        assert broken[0][0] == "node-x" and "did not open" in broken[0][1]
        conn.close()
        conn = await asyncio.to_thread(authenticated_connection, b, KEY, "node-y")
        await eventually(lambda: b.links.link("node-y") is not None)
        conn.close()  # a clean end
        await eventually(lambda: b.links.link("node-y") is None)
        assert [p for p, _ in broken] == ["node-x"]
    finally:
        await b.stop()


async def test_idle_links_are_retired_and_redialed_without_losing_a_frame() -> None:
    addresses: dict[str, tuple[str, int]] = {}
    fast = {"link_idle_timeout": 0.3}
    a = await PeerNode("node-a", addresses, key=KEY, listener_kwargs=fast).start()
    b = await PeerNode("node-b", addresses, key=KEY, listener_kwargs=fast).start()
    try:
        await a.send("node-b", token(0))
        await b.received_async(1)
        first = a.links.link("node-b")
        for node in (a, b):
            node.lane.retire_idle(0.3)  # what the listener's sweep does every few seconds
        await asyncio.sleep(0.5)
        for node in (a, b):
            node.lane.retire_idle(0.3)
        await eventually(lambda: a.links.link("node-b") is None and b.links.link("node-a") is None)
        for i in range(1, 20):
            await (a if i % 2 else b).send("node-b" if i % 2 else "node-a", token(i))
        got = await b.received_async(10) + await a.received_async(9)
        assert sorted(m.at for _, m in got) == list(range(2, 21))
        assert a.links.link("node-b") is not first
    finally:
        await b.stop()
        await a.stop()


async def test_links_for_a_purpose_are_proved_and_sealed_on_the_event_loop(sealed_pair) -> None:
    a, b = sealed_pair
    seen = []

    async def echo(link) -> None:
        frame = await link.receive()
        seen.append((link.peer, link.sealed))
        await link.send({"t": "echo"}, bytes(frame.payload) * 2)

    b.listener.serve_purpose("weights", echo)
    auth = LinkAuth("node-a", SWARM, KEY)
    link = await dial_stream((HOST, b.port), auth, "weights", expected_peer="node-b", max_payload=1 << 20)
    try:
        assert link.peer == "node-b" and link.sealed
        await link.send({"t": "ask"}, b"abc")
        frame = await link.receive()
        assert frame.header["t"] == "echo" and bytes(frame.payload) == b"abcabc"
        assert seen == [("node-a", True)]
    finally:
        await link.close()
    with pytest.raises(HandshakeRejected, match="purpose"):
        await dial_stream((HOST, b.port), auth, "nothing_here", max_payload=1 << 20)
    with pytest.raises(HandshakeRejected, match="auth"):
        await dial_stream((HOST, b.port), LinkAuth("node-a", SWARM, OTHER_KEY), "weights", max_payload=1 << 20)
    with pytest.raises(HandshakeRejected, match="node"):
        await dial_stream((HOST, b.port), auth, "weights", expected_peer="node-z", max_payload=1 << 20)


async def test_profiles_are_fetched_over_proved_links_only() -> None:
    addresses: dict[str, tuple[str, int]] = {}
    b = await PeerNode("node-b", addresses, key=KEY, profile=profile_of("node-b", 0)).start()
    liar = await PeerNode("node-l", addresses, key=KEY, profile=profile_of("node-b", 0)).start()  # says it is b
    try:
        got = await ProfileFetcher(LinkAuth("node-a", SWARM, KEY))(HOST, b.port, 2.0)
        assert got.node_id == "node-b"
        for fetcher, port, why in ((ProfileFetcher(LinkAuth("node-a", SWARM, OTHER_KEY)), b.port, "auth"),
                                   (ProfileFetcher(LinkAuth("node-a", SWARM, None)), b.port, "auth"),
                                   (ProfileFetcher(LinkAuth("node-a", SWARM, KEY)), liar.port, "profile of")):
            with pytest.raises(ProfileExchangeError, match=why):
                await fetcher(HOST, port, 2.0)
        # the plain profile request is not answered with a secret
        assert await asyncio.to_thread(raw_session, b.port, b"SWPF", 1.0) == b""
    finally:
        await liar.stop()
        await b.stop()


async def test_connections_over_budget_are_closed_at_once_and_peers_still_connect(caplog) -> None:
    addresses: dict[str, tuple[str, int]] = {}
    budget = ConnectionBudget(per_address=4, total=6)
    b = await PeerNode("node-b", addresses, key=KEY, listener_kwargs={"budget": budget}).start()
    a = await PeerNode("node-a", addresses, key=KEY).start()
    held = []
    try:
        for _ in range(10):  # strangers that say nothing: each holds a slot until the handshake timeout
            s = socket.create_connection((HOST, b.port))
            held.append(s)
        await eventually(lambda: budget.held == 4)

        def closed_by_node(s: socket.socket) -> bool:
            s.settimeout(1)
            try:
                return s.recv(1) == b""
            except ConnectionResetError:
                return True
            except TimeoutError:
                return False

        assert [closed_by_node(s) for s in held] == [False] * 4 + [True] * 6
        assert budget.held == 4
        for s in held:
            s.close()
        await eventually(lambda: budget.held == 0)
        await a.send("node-b", token(0))  # the peer gets a slot again
        await b.received_async(1)
        assert budget.held == 1
        over = [r for r in caplog.records if "at once" in r.getMessage()]
        assert len(over) == 1, [r.getMessage() for r in over]  # six refused, one line
    finally:
        for s in held:
            s.close()
        await a.stop()
        await b.stop()
