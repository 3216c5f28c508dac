"""A member that comes back is asked at once: a proved hello from it ends the back-off of its endpoint.

With a swarm secret, an mDNS record only names an endpoint to ask, and an endpoint that does not
answer is asked later and later (discovery/probe_backoff.py). A restarted member proves itself
when it probes us (its hello, over real loopback sockets here): from then on its endpoint is asked
in the next poll round, not after the back-off. The back-offs here are an hour long, so a member
admitted within the test's deadline was asked because it proved itself, not because time passed.
"""

from __future__ import annotations

import asyncio

import pytest

from discovery import Discovery, NodeProfile
from discovery.probe_backoff import ProbeBackoff
from discovery.profile_exchange import ProfileExchangeError
from discovery.static_peers import Endpoint
from swarm.transport.link_crypto import stretch_secret
from swarm.transport.link_handshake import LinkAuth
from swarm.transport.peer_profiles import ProfileFetcher
from helpers import eventually, free_ports
from peer_nodes import HOST, SWARM, PeerNode

pytestmark = pytest.mark.timeout(60)

HOUR = 3600.0


def profile_of(node_id: str, peer_port: int) -> NodeProfile:
    return NodeProfile(node_id=node_id, name=f"node-{node_id}", swarm=SWARM, api_port=8000, peer_port=peer_port,
                       backend="cpu", memory_total=16 << 30, memory_available=8 << 30, speed=0.0125,
                       model_id="m", model_fingerprint="abc123", instance=f"inst-{node_id}", started_at=1000.0)


def hour_long_backoff() -> ProbeBackoff:
    return ProbeBackoff(free_tries=0, base_s=HOUR, max_s=HOUR)


class Member:
    """A Discovery with a secret (mDNS records are hints) and the peer port that serves its profile."""

    def __init__(self, node_id: str, port: int, key: bytes) -> None:
        self.profile = profile_of(node_id, port)
        self.backoff = hour_long_backoff()
        self.discovery = Discovery(self.profile, mdns=False, interfaces=[HOST], mdns_is_hint=True,
                                   fetch_profile=ProfileFetcher(LinkAuth(node_id, SWARM, key)),
                                   probe_interval=0.2, probe_backoff=self.backoff)
        self.node = PeerNode(node_id, {}, port=port, profile=self.profile, key=key,
                             listener_kwargs={"on_proved": self.discovery.heard_from})

    def sees_record_of(self, other: NodeProfile) -> None:
        self.discovery._on_mdns_found(f"{other.node_id}._swarm._tcp.local.", other.as_hint(), (HOST,))

    def peers(self) -> list[str]:
        return [p.node_id for p in self.discovery.view()]

    async def start(self) -> "Member":
        await self.node.start()
        await self.discovery.start()
        return self

    async def stop(self) -> None:
        await self.discovery.stop()
        await self.node.stop()


async def test_a_member_back_from_a_restart_is_asked_as_soon_as_it_proves_itself():
    key = stretch_secret("member-return")
    port_a, port_b = free_ports(2)
    a = await Member("a", port_a, key).start()
    b = None
    try:
        b_endpoint = Endpoint(HOST, port_b, "mdns")
        a.sees_record_of(profile_of("b", port_b))  # b is down: its endpoint fails, next try in an hour
        await eventually(lambda: a.backoff.failures(b_endpoint) >= 1, what="a asked b's endpoint and failed")
        b = Member("b", port_b, key)
        b.sees_record_of(a.profile)
        await b.start()
        # b admits a (its own back-off is fresh); its probe proves b to a, which asks b at once.
        await eventually(lambda: b.peers() == ["a"], 30, "b admitted a")
        await eventually(lambda: a.peers() == ["b"], 30, "a admitted b without waiting out the back-off")
        assert a.backoff.failures(b_endpoint) == 0
    finally:
        if b is not None:
            await b.stop()
        await a.stop()


async def test_a_proved_hello_ends_the_back_off_only_of_records_of_its_id_at_its_address():
    async def nobody_answers(host: str, port: int, timeout: float) -> NodeProfile:
        raise ProfileExchangeError(f"{host}:{port}: nobody")

    backoff = hour_long_backoff()
    d = Discovery(profile_of("a", 7000), mdns=False, interfaces=[HOST], mdns_is_hint=True,
                  fetch_profile=nobody_answers, probe_interval=0.1, probe_backoff=backoff,
                  static_peers=[(HOST, 7003), ("127.0.0.5", 7004)])
    await d.start()
    try:
        records = {"b": ("b", HOST, 7001), "ghost": ("b", "127.0.0.9", 7001), "c": ("c", HOST, 7002)}
        for name, (node_id, host, port) in records.items():
            d._on_mdns_found(f"{name}._swarm._tcp.local.", profile_of(node_id, port).as_hint(), (host,))
        endpoints = {name: Endpoint(host, port, "mdns") for name, (_, host, port) in records.items()}
        endpoints |= {"static here": Endpoint(HOST, 7003, "static"),
                      "static elsewhere": Endpoint("127.0.0.5", 7004, "static")}
        await eventually(lambda: all(backoff.failures(e) == 1 for e in endpoints.values()),
                         what="every endpoint asked once and failed")
        d.heard_from("b", HOST)
        left = {name: backoff.failures(e) for name, e in endpoints.items()}
        # b's record at the hello's address, and the static peer we were told of there, are asked now;
        # a record of b's id elsewhere (anyone may publish one) and another node's record are not.
        assert left == {"b": 0, "ghost": 1, "c": 1, "static here": 0, "static elsewhere": 1}, left
        await eventually(lambda: backoff.failures(endpoints["b"]) == 1, what="b's endpoint asked again")
    finally:
        await d.stop()
