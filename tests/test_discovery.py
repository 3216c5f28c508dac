"""Unit tests for discovery: profiles, node ids, the peer table, SWPF, and the
Discovery class with static peers over loopback (no zeroconf here; mDNS is
exercised in network namespaces by test_discovery_netns.py)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import pytest

from discovery import Discovery, NodeProfile, PeerEvent, fetch_profile, serve_liveness_port
from discovery.memory import measure_memory, parse_size
from discovery.node_id import load_or_mint_node_id, must_remint
from discovery.profile import MAX_TXT_ENTRY, MalformedProfile, belongs_to_swarm
from discovery.liveness import LATE_PROBE_FAILURES, FailureCounter
from discovery.profile_exchange import MAGIC, LateAnswer, ProfileExchangeError
from discovery.static_peers import parse_peer_address
from discovery.view import PeerTable
from helpers import eventually, free_ports, start_static_discovery

pytestmark = pytest.mark.timeout(30)


def make_profile(node_id: str = "n1", **overrides) -> NodeProfile:
    fields = dict(node_id=node_id, name=f"node-{node_id}", swarm="default", api_port=8000, peer_port=7946,
                  backend="cpu", memory_total=16 << 30, memory_available=8 << 30, speed=0.0125,
                  model_id="mlx-community/Qwen3-0.6B-4bit", model_fingerprint="abc123",
                  instance=f"inst-{node_id}", started_at=1000.0)
    fields.update(overrides)
    return NodeProfile(**fields)


def as_wire_txt(profile: NodeProfile) -> dict[bytes, bytes]:
    return {k.encode(): v.encode() for k, v in profile.to_txt().items()}


# -- profile ------------------------------------------------------------
def test_profile_txt_round_trip_is_exact():
    profile = make_profile(speed=0.1 + 0.2, extra={"plan": "p7", "layers": "0-15"})
    assert NodeProfile.from_txt(as_wire_txt(profile)) == profile
    assert NodeProfile.from_txt(profile.to_txt()) == profile
    assert NodeProfile.from_json(profile.to_json()) == profile
    assert all(len(k.encode()) + 1 + len(v.encode()) < 255 for k, v in profile.to_txt().items())


def test_profile_rejects_oversized_txt_entries():
    with pytest.raises(MalformedProfile, match="TXT entry"):
        make_profile(model_id="m" * MAX_TXT_ENTRY)
    with pytest.raises(MalformedProfile, match="TXT entry"):
        make_profile(extra={"note": "x" * 300})


@pytest.mark.parametrize("txt", [
    {},  # someone else's service with an empty record
    {b"path": b"/printer"},
    {b"id": b"x", b"name": b"n", b"swarm": b"s", b"api": b"notaport", b"peer": b"1"},
    {b"id": b"x", b"name": b"n", b"swarm": b"s", b"api": b"1", b"peer": b"99999"},
    {b"id": b"x", b"name": b"n", b"swarm": b"s", b"api": b"1", b"peer": b"1", b"be": b"tpu"},
    {b"id": b"x", b"name": b"n", b"swarm": b"s", b"api": b"1", b"peer": b"1", b"spd": b"nan"},
    {b"id": b"\xff\xfe", b"name": b"n", b"swarm": b"s", b"api": b"1", b"peer": b"1"},
    {b"id": None, b"name": b"n", b"swarm": b"s", b"api": b"1", b"peer": b"1"},
])
def test_malformed_txt_records_are_rejected(txt):
    with pytest.raises(MalformedProfile):
        NodeProfile.from_txt(txt)


def test_unknown_txt_keys_are_ignored_for_forward_compatibility():
    txt = as_wire_txt(make_profile())
    txt[b"future_field"] = b"42"
    assert NodeProfile.from_txt(txt) == make_profile()


def test_replace_puts_unknown_fields_into_extra_and_none_removes():
    profile = make_profile().replace(plan="p1", layers="0-3", speed=0.5)
    assert profile.extra == {"plan": "p1", "layers": "0-3"} and profile.speed == 0.5
    assert profile.replace(plan=None).extra == {"layers": "0-3"}
    hash(profile)  # frozen profiles stay hashable despite the extra mapping


def test_swarm_and_protocol_version_filtering():
    assert belongs_to_swarm(make_profile(), "default")
    assert not belongs_to_swarm(make_profile(), "other")
    assert not belongs_to_swarm(make_profile(protocol_version=99), "default")


# -- memory -------------------------------------------------------------
def test_memory_limit_caps_available_memory():
    total, available = measure_memory()
    assert total > 0 and 0 < available <= total
    assert measure_memory(1 << 20)[1] == 1 << 20
    assert parse_size("1.5G") == 3 << 29 and parse_size("512MiB") == 512 << 20 and parse_size("100") == 100


# -- node ids -----------------------------------------------------------
def test_node_id_is_stable_across_restarts(tmp_path):
    first = load_or_mint_node_id(tmp_path / "state")
    assert load_or_mint_node_id(tmp_path / "state") == first
    assert json.loads((tmp_path / "state" / "node_id").read_text())["node_id"] == first


def test_two_state_dirs_on_one_host_get_different_ids(tmp_path):
    assert load_or_mint_node_id(tmp_path / "a") != load_or_mint_node_id(tmp_path / "b")


def test_copied_state_dir_gets_a_new_id_and_the_original_keeps_its_own(tmp_path):
    original = load_or_mint_node_id(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    copied = load_or_mint_node_id(tmp_path / "copy")
    assert copied != original
    assert load_or_mint_node_id(tmp_path / "a") == original
    assert load_or_mint_node_id(tmp_path / "copy") == copied  # and the copy is stable from now on


def test_state_dir_copied_to_another_machine_gets_a_new_id(tmp_path):
    here = load_or_mint_node_id(tmp_path / "a", host_id="machine-1")
    assert load_or_mint_node_id(tmp_path / "a", host_id="machine-2") != here


def test_corrupt_node_id_file_is_replaced(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "node_id").write_text("{not json")
    node_id = load_or_mint_node_id(tmp_path / "s")
    assert node_id and load_or_mint_node_id(tmp_path / "s") == node_id


def test_exactly_the_later_started_duplicate_remints():
    early = make_profile("same", instance="aaa", started_at=1.0)
    late = make_profile("same", instance="bbb", started_at=2.0)
    tie = make_profile("same", instance="ccc", started_at=1.0)
    assert must_remint(late, early) and not must_remint(early, late)
    assert must_remint(tie, early) != must_remint(early, tie)
    assert not must_remint(early, early)
    assert not must_remint(early, make_profile("other"))


# -- peer table ---------------------------------------------------------
def kinds(events: list[PeerEvent]) -> list[tuple[str, str]]:
    return [(e.kind, e.node_id) for e in events]


def test_table_join_update_leave():
    table = PeerTable(make_profile("me"))
    peer = make_profile("p")
    assert kinds(table.admit(peer, ("10.0.0.2",), "mdns")) == [("join", "p")]
    assert table.admit(peer, ("10.0.0.2",), "mdns") == []  # nothing changed
    assert kinds(table.admit(peer.replace(layers="0-7"), ("10.0.0.2",), "mdns")) == [("update", "p")]
    assert table.mark_gone("p", "not-its-instance") == []
    assert kinds(table.mark_gone("p", peer.instance)) == [("leave", "p")]
    assert table.peers == {}


def test_table_ignores_self_other_swarms_and_incompatible_versions():
    me = make_profile("me")
    table = PeerTable(me)
    assert table.admit(me, ("10.0.0.1",), "mdns") == []
    assert table.admit(make_profile("x", swarm="other"), ("10.0.0.2",), "mdns") == []
    assert table.admit(make_profile("y", protocol_version=1), ("10.0.0.3",), "mdns") == []  # before the secret
    assert table.peers == {}


def test_table_restart_at_same_endpoint_is_leave_then_join_and_stale_records_are_ignored():
    table = PeerTable(make_profile("me"))
    old = make_profile("p", instance="old", started_at=1.0)
    new = make_profile("p", instance="new", started_at=2.0)
    table.admit(old, ("10.0.0.2",), "mdns")
    events = table.admit(new, ("10.0.0.2",), "mdns")
    assert [(e.kind, e.profile.instance) for e in events] == [("leave", "old"), ("join", "new")]
    assert table.admit(old, ("10.0.0.2",), "mdns") == []  # a late stale record of the old instance


def test_table_duplicate_id_at_another_endpoint_keeps_the_earlier_started():
    table = PeerTable(make_profile("me"))
    early = make_profile("dup", instance="early", started_at=1.0)
    late = make_profile("dup", instance="late", started_at=2.0)
    table.admit(late, ("10.0.0.3",), "mdns")
    events = table.admit(early, ("10.0.0.2",), "mdns")
    assert [(e.kind, e.profile.instance) for e in events] == [("leave", "late"), ("join", "early")]
    assert table.admit(late, ("10.0.0.3",), "mdns") == []
    # The late one re-mints: the same instance under a new id joins.
    assert kinds(table.admit(late.replace(node_id="fresh"), ("10.0.0.3",), "mdns")) == [("join", "fresh")]


def test_table_reminted_instance_leaves_under_its_old_id():
    table = PeerTable(make_profile("me"))
    table.admit(make_profile("old-id", instance="i"), ("10.0.0.2",), "mdns")
    events = table.admit(make_profile("new-id", instance="i"), ("10.0.0.2",), "mdns")
    assert kinds(events) == [("leave", "old-id"), ("join", "new-id")]


# -- SWPF and liveness over loopback -------------------------------------
async def probe(host: str, port: int, timeout: float = 0.5) -> bool:
    """A bare TCP connect: does anything accept at host:port?"""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


async def test_profile_exchange_and_probe_against_the_helper_listener():
    profile = make_profile(extra={"layers": "0-3"})
    server = await serve_liveness_port("127.0.0.1", 0, profile)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await fetch_profile("127.0.0.1", port, timeout=2) == profile
        assert await probe("127.0.0.1", port)
    finally:
        server.close()
        await server.wait_closed()
    assert not await probe("127.0.0.1", port)
    with pytest.raises(ProfileExchangeError):
        await fetch_profile("127.0.0.1", port, timeout=1)


async def test_fetch_profile_rejects_listeners_that_do_not_speak_swpf():
    async def garbage(reader, writer):
        assert await reader.readexactly(4) == MAGIC
        writer.write(b"\x00\x00\x00\x05hello")
        await writer.drain()
        writer.close()

    async def closes(reader, writer):
        writer.close()

    for handler in (garbage, closes):
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(ProfileExchangeError):
                await fetch_profile("127.0.0.1", port, timeout=1)
            assert await probe("127.0.0.1", port)  # liveness works against any listener
        finally:
            server.close()
            await server.wait_closed()


def test_parse_peer_address():
    assert parse_peer_address("10.0.0.2:7946") == ("10.0.0.2", 7946)
    assert parse_peer_address("[fd00::1]:7946") == ("fd00::1", 7946)
    for bad in ("10.0.0.2", ":7946", "host:0", "host:x"):
        with pytest.raises(ValueError):
            parse_peer_address(bad)


# -- Discovery with static peers only (loopback, no zeroconf) ------------
async def start_static_node(node_id: str, peers: list[int], port: int, sink) -> tuple[Discovery, asyncio.Server]:
    return await start_static_discovery(make_profile(node_id, peer_port=port, started_at=time.time()), peers, sink)


async def next_event(queue: asyncio.Queue, kind: str, node_id: str, timeout: float = 5.0) -> PeerEvent:
    async with asyncio.timeout(timeout):
        while True:
            event = await queue.get()
            if event.kind == kind and event.node_id == node_id:
                return event


async def test_static_peers_join_update_leave_and_view():
    port_a, port_b = free_ports(2)
    events_a: asyncio.Queue[PeerEvent] = asyncio.Queue()
    seen_by_b: list[PeerEvent] = []

    async def on_event_b(event: PeerEvent) -> None:  # async callbacks are awaited in order
        seen_by_b.append(event)

    a, server_a = await start_static_node("a", [port_b], port_a, events_a)
    b, server_b = await start_static_node("b", [port_a], port_b, on_event_b)
    try:
        joined = await next_event(events_a, "join", "b")
        assert joined.profile == b.profile and joined.addresses == ("127.0.0.1",)
        assert [p.node_id for p in a.view()] == ["b"]
        assert [(p.node_id, p.source) for p in a.view(include_self=True)] == [("a", "self"), ("b", "static")]

        await b.update_profile(layers="4-7")
        updated = await next_event(events_a, "update", "b")
        assert updated.profile.extra == {"layers": "4-7"}

        t0 = time.monotonic()
        await b.stop()
        server_b.close()
        await server_b.wait_closed()
        await next_event(events_a, "leave", "b")
        # Three failed probes 0.75 s apart: 1.5-2.75 s by design; the rest is a loaded machine's margin.
        assert time.monotonic() - t0 <= 5.0
        assert a.view() == []
        assert [e.kind for e in seen_by_b if e.node_id == "a"][:1] == ["join"]
    finally:
        await a.stop()
        server_a.close()
        await server_a.wait_closed()


def test_a_hint_says_who_and_where_and_nothing_to_plan_with():
    hint = make_profile("x", extra={"plan": "p1"}).as_hint()
    assert hint.is_hint and (hint.node_id, hint.peer_port, hint.instance) == ("x", 7946, "inst-x")
    assert hint.memory_available == hint.speed == 0 and not hint.model_fingerprint and "plan" not in hint.extra
    assert NodeProfile.from_txt(hint.to_txt()) == hint


async def test_with_mdns_as_a_hint_only_what_the_fetcher_returns_enters_the_view():
    """mDNS records (fed in as zeroconf would) only name endpoints; the injected fetcher decides."""
    real = make_profile("b", peer_port=7001)
    asked: list[tuple[str, int]] = []

    async def fetch(host: str, port: int, timeout: float) -> NodeProfile:
        asked.append((host, port))
        if (host, port) == ("127.0.0.1", 7001):
            return real
        raise ProfileExchangeError(f"{host}:{port} did not prove the secret")

    d = Discovery(make_profile("a", peer_port=7000), mdns=False, fetch_profile=fetch, mdns_is_hint=True,
                  probe_interval=0.1, probe_timeout=0.5)
    await d.start()
    try:
        lies = make_profile("b", peer_port=7001, memory_available=2**40, speed=1e-6, extra={"plan": "mine"})
        d._on_mdns_found("rogue._swarm._tcp.local.", make_profile("rogue", peer_port=9), ("127.0.0.9",))
        d._on_mdns_found("b._swarm._tcp.local.", lies, ("127.0.0.1",))
        assert d.view() == []  # nothing from the record itself
        await eventually(lambda: [p.node_id for p in d.view()] == ["b"])
        assert d.view()[0].profile == real  # what the fetcher returned, not what the record said
        await eventually(lambda: asked.count(("127.0.0.9", 9)) >= 2)  # still asked, never admitted
        assert [p.node_id for p in d.view()] == ["b"]
        d._on_mdns_lost("b._swarm._tcp.local.")  # anyone can send a goodbye: the peer is asked first
        await asyncio.sleep(0.5)
        assert [p.node_id for p in d.view()] == ["b"]
    finally:
        await d.stop()


async def test_an_open_node_treats_a_hint_record_as_an_endpoint_to_ask():
    fetched = asyncio.Event()

    async def fetch(host: str, port: int, timeout: float) -> NodeProfile:
        fetched.set()
        raise ProfileExchangeError("refused: the answering node has a swarm secret")

    d = Discovery(make_profile("a"), mdns=False, fetch_profile=fetch, probe_interval=0.1)
    await d.start()
    try:
        d._on_mdns_found("s._swarm._tcp.local.", make_profile("s", peer_port=7002).as_hint(), ("127.0.0.1",))
        await asyncio.wait_for(fetched.wait(), 5)
        assert d.view() == []
        d._on_mdns_found("o._swarm._tcp.local.", make_profile("o", peer_port=7003), ("127.0.0.1",))
        assert [p.node_id for p in d.view()] == ["o"]  # an open record is still a profile, as before
    finally:
        await d.stop()


def test_a_late_answer_counts_toward_a_longer_limit_than_a_refusal():
    counter = FailureCounter(3)
    assert [counter.record(False) for _ in range(3)] == [False, False, True]  # refused thrice: gone
    counter = FailureCounter(3)
    assert not any(counter.record(False, late=True) for _ in range(LATE_PROBE_FAILURES - 1))
    assert counter.record(False, late=True)  # a process there, but silent for ~12 s: gone too
    counter = FailureCounter(3)
    for _ in range(5):
        counter.record(False, late=True)
    assert [counter.record(False) for _ in range(3)] == [False, False, True]  # slow, then killed: 3 refusals
    assert not counter.record(True) and counter.failures == counter.missed == 0


async def test_fetch_profile_says_late_only_where_a_process_took_the_connection():
    async def silent(reader, writer):
        await asyncio.sleep(5)  # takes the connection, never answers (a node on a machine with no core free)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(LateAnswer):
            await fetch_profile("127.0.0.1", port, timeout=0.3)
    finally:
        server.close()
    closed = free_ports(1)[0]
    with pytest.raises(ProfileExchangeError) as refused:
        await fetch_profile("127.0.0.1", closed, timeout=0.3)
    assert not isinstance(refused.value, LateAnswer)


async def test_a_peer_answering_late_stays_in_the_view_longer_than_a_dead_one():
    late = {"b": True}

    async def fetch(host: str, port: int, timeout: float) -> NodeProfile:
        if late["b"]:
            raise LateAnswer(f"{host}:{port}: no answer in time")
        raise ProfileExchangeError(f"{host}:{port}: refused")

    d = Discovery(make_profile("a"), mdns=False, fetch_profile=fetch, probe_interval=0.02)
    await d.start()
    try:
        d._on_mdns_found("b._swarm._tcp.local.", make_profile("b", peer_port=7003), ("127.0.0.1",))
        assert [p.node_id for p in d.view()] == ["b"]
        await asyncio.sleep(0.02 * 8)  # well past 3 probes, short of LATE_PROBE_FAILURES
        assert [p.node_id for p in d.view()] == ["b"]
        late["b"] = False  # now refused: gone after 3 more
        await eventually(lambda: d.view() == [], timeout=5)
    finally:
        await d.stop()
