"""Discovery: advertise this node, learn its peers, report joins/updates/leaves.

Sources of knowledge, all funnelled into one PeerTable:
  * mDNS (unless mdns=False): announcements and TXT updates of other nodes;
    an mDNS goodbye is an immediate leave.
  * liveness: every admitted peer is asked for its profile every
    `probe_interval` (rounds space out beyond 15 peers: liveness.PROBES_PER_S);
    `probe_failures` failures in a row is a leave (< 3 s up to 15 peers).
  * endpoint polling: static peers, and mDNS peers declared gone, are asked
    for their profile every `probe_interval` until they answer; one that keeps
    failing is asked less and less often, and only so many per round
    (probe_backoff.py: records naming endpoints that never answer cost bounded work).
    A peer that proves itself to us (`heard_from`: a restarted member probing us)
    is asked at once at the endpoints its records give at that address, back-off
    or not: a member coming back is served again without waiting out its back-off.

How a profile is asked for is the caller's: `fetch_profile(host, port, timeout)`,
by default the plain SWPF exchange (profile_exchange.py; the caller then serves
it on the peer port). A node with a swarm secret gives a fetcher that proves the
secret both ways, and `mdns_is_hint=True`: then an mDNS record only names an
endpoint to ask, nothing enters the view but what that fetcher returned, our own
record is a hint (`NodeProfile.as_hint`: no memory, speed or model to plan with)
that profile changes do not re-announce (peers see them through the probe), and a
goodbye only makes us probe that peer at once. Records that are hints are treated
so by every node, secret or not.

Our own id in another node's record: the later-started of the two must take a new id
(node_id.must_remint). Standalone, discovery re-mints in place (its id is only its own);
a caller whose other parts hold the id too passes `on_duplicate` and decides itself
(the swarm node starts over under a new id: swarm/node/node.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from typing import Any, Awaitable, Callable, Iterable, Union

from . import liveness
from .mdns import MdnsAgent, local_ipv4_addresses, resolve_interfaces
from .node_id import must_remint, remint_node_id
from .probe_backoff import ProbeBackoff
from .profile import NodeProfile
from .profile_exchange import LateAnswer, OwnResourcesExhausted, ProfileExchangeError, fetch_profile
from .static_peers import Endpoint, ProfileFetcher, poll_endpoints
from .view import PeerEvent, PeerInfo, PeerTable

log = logging.getLogger(__name__)

EventSink = Union[Callable[[PeerEvent], Union[None, Awaitable[None]]], "asyncio.Queue[PeerEvent]"]
# (our profile, the other node's, its addresses): called when we are the one that must move
OnDuplicate = Callable[[NodeProfile, NodeProfile, tuple[str, ...]], None]

MAX_ADDRESSES = 8  # of a peer admitted by a poll (a record may name many)
LATE = "late"  # _check: the probe found a process that did not answer in time


class Discovery:
    def __init__(
        self,
        profile: NodeProfile,
        *,
        interfaces: list[str] | None = None,
        static_peers: Iterable[tuple[str, int]] = (),
        mdns: bool = True,
        on_event: EventSink | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        probe_interval: float = liveness.PROBE_INTERVAL,
        probe_timeout: float = liveness.PROBE_TIMEOUT,
        probe_failures: int = liveness.PROBE_FAILURES,
        on_duplicate: OnDuplicate | None = None,
        fetch_profile: ProfileFetcher = fetch_profile,
        mdns_is_hint: bool = False,
        probe_backoff: ProbeBackoff | None = None,
    ) -> None:
        """`profile.swarm` is the swarm we join; `interfaces` (IPs or names) restricts
        mDNS, None = all interfaces; `state_dir` is where a re-minted id is stored;
        `on_duplicate`: told (once per other instance) instead of re-minting in place;
        `fetch_profile` and `mdns_is_hint`: see the module's docstring; `probe_backoff`: how endpoints that
        do not answer are asked again (probe_backoff.py's defaults if None)."""
        if not profile.instance:
            raise ValueError("profile.instance must be set (see local_profile.build_local_profile)")
        self._table = PeerTable(profile)
        self._interfaces = resolve_interfaces(interfaces)
        self._mdns = MdnsAgent(self._interfaces, self._on_mdns_found, self._on_mdns_lost) if mdns else None
        self._addresses = tuple(self._interfaces or local_ipv4_addresses())
        self._static = [Endpoint(h, p, "static") for h, p in static_peers]
        self._fetch, self._mdns_is_hint = fetch_profile, mdns_is_hint
        self._poll_now = asyncio.Event()  # a new endpoint to ask: do not wait for the next round
        # name -> (endpoint, node_id, instance, only a hint, every address it gives) of every mDNS record of
        # our swarm
        self._mdns_endpoints: dict[str, tuple[Endpoint, str, str, bool, tuple[str, ...]]] = {}
        self._gone_instances: set[str] = set()  # ignore stale mDNS records of these
        self._failures: dict[tuple[str, str], liveness.FailureCounter] = {}
        self._on_event = on_event
        self._events: asyncio.Queue[PeerEvent] = asyncio.Queue()
        self._state_dir = state_dir
        self._interval, self._timeout, self._failure_limit = probe_interval, probe_timeout, probe_failures
        self._exhausted_said_at = float("-inf")
        self._backoff = probe_backoff or ProbeBackoff()
        self._tasks: list[asyncio.Task[Any]] = []
        self._reminting = False
        self._on_duplicate = on_duplicate
        self._duplicates_seen: set[str] = set()  # instances of other nodes seen with our id
        self._profile_lock = asyncio.Lock()

    # -- public ---------------------------------------------------------
    @property
    def profile(self) -> NodeProfile:
        return self._table.own

    @property
    def node_id(self) -> str:
        return self._table.own.node_id

    def view(self, include_self: bool = False) -> list[PeerInfo]:
        """Current peers (copies), sorted by node id; self first when included."""
        peers = [PeerInfo(p.profile, p.addresses, p.source, p.last_seen) for p in self._table.peers.values()]
        peers.sort(key=lambda p: p.node_id)
        if include_self:
            peers.insert(0, PeerInfo(self.profile, self._addresses, "self"))
        return peers

    def is_peer_address(self, address: str) -> bool:
        """Does a peer in the view (proved, with a swarm secret) have this address? (Its connections from
        there are served before strangers': transport/connection_budget.py.)"""
        return any(address in p.addresses for p in self._table.peers.values())

    def endpoint_of(self, node_id: str) -> tuple[str, int] | None:
        """A peer's (address, peer port). One dict lookup, so other threads may call it too."""
        peer = self._table.peers.get(node_id)
        return peer.endpoint if peer is not None else None

    def heard_from(self, node_id: str, address: str) -> None:
        """A node proved (with the swarm secret) that it is `node_id`, from `address`: the endpoints not in
        the view that our records give for it there (mDNS records naming that id, static peers) are asked
        in this poll round. Only at that address: records anyone publishes with its id elsewhere keep their
        back-off."""
        admitted = {p.endpoint for p in self._table.peers.values()}
        ready = [endpoint for endpoint, record_id, *_ in self._mdns_endpoints.values() if record_id == node_id]
        ready += self._static
        ready = [e for e in ready if e.host == address and (e.host, e.port) not in admitted]
        for endpoint in ready:
            if self._backoff.failures(endpoint):
                self._backoff.answered(endpoint)
                self._poll_now.set()

    def _advertised(self) -> NodeProfile:
        return self.profile.as_hint() if self._mdns_is_hint else self.profile

    async def start(self) -> None:
        if self._mdns is not None:
            await self._mdns.start(self._advertised())
        # Events seen while registering wait in the queue until start() returns.
        self._tasks.append(asyncio.create_task(self._dispatch_events(), name="discovery-events"))
        self._tasks.append(asyncio.create_task(self._liveness_loop(), name="discovery-liveness"))
        self._tasks.append(asyncio.create_task(self._poll_loop(), name="discovery-poll"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._mdns is not None:
            await self._mdns.stop()

    async def update_profile(self, **changes: Any) -> NodeProfile:
        """Change fields (unknown names go to `extra`) and re-announce."""
        async with self._profile_lock:
            before = self._advertised()
            self._table.own = self.profile.replace(**changes)
            if self._mdns is not None and self._advertised() != before:
                await self._mdns.update(self._advertised())
            return self.profile

    async def __aenter__(self) -> Discovery:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- observations ---------------------------------------------------
    def _observe(self, profile: NodeProfile, addresses: tuple[str, ...], source: str) -> None:
        if profile.node_id == self.node_id and profile.instance != self.profile.instance:
            self._on_duplicate_of_self(profile, addresses)
            return
        self._emit(self._table.admit(profile, addresses, source))

    def _on_mdns_found(self, name: str, profile: NodeProfile, addresses: tuple[str, ...]) -> None:
        hint = self._mdns_is_hint or profile.is_hint
        if profile.swarm == self.profile.swarm:
            self._mdns_endpoints[name] = (Endpoint(addresses[0], profile.peer_port, "mdns"),
                                          profile.node_id, profile.instance, hint, tuple(addresses))
            if hint:
                self._poll_now.set()
        if hint:
            return  # only an endpoint to ask (the poll loop does): never a profile to admit
        if profile.instance in self._gone_instances:
            return  # liveness said it is gone; only a successful poll brings it back
        self._observe(profile, addresses, "mdns")

    def _on_mdns_lost(self, name: str) -> None:
        known = self._mdns_endpoints.pop(name, None)
        if known is None:
            return
        _, node_id, instance, hint, _ = known
        if not hint:
            self._emit(self._table.mark_gone(node_id, instance))
            return
        # Anyone can send a goodbye in any name: ask the peer itself, now, whether it is gone.
        peer = self._table.get(node_id)
        if peer is not None and peer.profile.instance == instance:
            self._tasks.append(asyncio.create_task(self._probe_after_goodbye(peer), name="discovery-goodbye"))

    async def _probe_after_goodbye(self, peer: PeerInfo) -> None:
        if await self._check(peer) is False and self._table.get(peer.node_id) is peer:
            log.info("peer %s (%s) said goodbye and no longer answers: gone", peer.node_id, peer.endpoint)
            self._gone_instances.add(peer.profile.instance)
            self._emit(self._table.mark_gone(peer.node_id, peer.profile.instance))
        self._tasks[:] = [t for t in self._tasks if not t.done()]

    def _on_duplicate_of_self(self, other: NodeProfile, addresses: tuple[str, ...]) -> None:
        if other.peer_port == self.profile.peer_port and set(addresses) & set(self._addresses):
            return  # a stale record of our own former instance at our endpoint
        if other.instance in self._duplicates_seen:
            return  # seen (and acted on) already: every probe and record of it would say it again
        self._duplicates_seen.add(other.instance)
        log.warning(
            "DUPLICATE NODE ID %s: another node (instance %s at %s:%d) uses our id; %s",
            self.node_id, other.instance, addresses[0], other.peer_port,
            "we started later and take a new id" if must_remint(self.profile, other) else "it will take a new id",
        )
        if must_remint(self.profile, other) and self._on_duplicate is not None:
            self._on_duplicate(self.profile, other, addresses)
        elif must_remint(self.profile, other) and not self._reminting:
            self._reminting = True
            self._tasks.append(asyncio.create_task(self._remint(), name="discovery-remint"))

    async def _remint(self) -> None:
        try:
            old = self.node_id
            new_id = remint_node_id(self._state_dir)
            profile = await self.update_profile(node_id=new_id)
            log.warning("node id changed %s -> %s", old, new_id)
            self._emit([PeerEvent("remint", new_id, profile, self._addresses, old_node_id=old)])
        finally:
            self._reminting = False

    # -- loops ----------------------------------------------------------
    async def _liveness_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            peers = list(self._table.peers.values())
            results = await asyncio.gather(*(self._check(p) for p in peers))
            for peer, alive in zip(peers, results):
                if self._table.get(peer.node_id) is not peer or alive is None:
                    continue  # replaced or removed while we probed, or we could not probe at all
                key = (peer.node_id, peer.profile.instance)
                counter = self._failures.setdefault(key, liveness.FailureCounter(self._failure_limit))
                if alive is True:
                    self._table.touch(peer.node_id)
                if counter.record(alive is True, late=alive == LATE):
                    log.info("peer %s (%s) failed %d probes: gone", peer.node_id, peer.endpoint, counter.failures)
                    self._gone_instances.add(peer.profile.instance)
                    self._emit(self._table.mark_gone(*key))
            live_keys = {(p.node_id, p.profile.instance) for p in self._table.peers.values()}
            for key in set(self._failures) - live_keys:
                del self._failures[key]
            await asyncio.sleep(max(0.0, liveness.round_interval(self._interval, len(peers))
                                    - (loop.time() - started)))

    async def _check(self, peer: PeerInfo) -> bool | str | None:
        """Alive, gone, LATE (a process took the connection but did not answer in time), or None: this node is out of descriptors or memory, which says nothing of the peer
        (a node under a flood must not declare its peers dead and split the swarm)."""
        # The probe fetches the profile itself (SWPF), not just a TCP connect: it is the
        # only way to see a static peer's changes, and it repairs a lost mDNS update
        # (seen in tests: one multicast announcement of a new plan never arrived), so
        # every profile change reaches every peer within one probe interval.
        try:
            profile = await self._fetch_any(peer)
        except OwnResourcesExhausted as exc:
            now = asyncio.get_running_loop().time()
            if now - self._exhausted_said_at > 60:
                self._exhausted_said_at = now
                log.warning("cannot probe peers: this node is out of resources (%s); nobody is declared gone "
                            "for it", exc)
            return None
        except LateAnswer:
            return LATE
        except ProfileExchangeError:
            return False
        # A restarted node at the same endpoint shows up here as a newer instance,
        # which the peer table swaps in (a leave and a join).
        self._observe(profile, peer.addresses, peer.source)
        # Another id answering at its endpoint (it restarted under a new id, or the port is
        # another node's now): the probed one is not there.
        return profile.node_id == peer.node_id

    async def _fetch_any(self, peer: PeerInfo) -> NodeProfile:
        """The profile from the first of the peer's addresses that answers: a peer with several (Wi-Fi and
        a cable) is there while any of them answers; the data lane moves off one that stopped
        (swarm/node/path_choice.py). ProfileExchangeError from the last when none does."""
        late = None
        for i, address in enumerate(peer.addresses):
            try:
                return await self._fetch(address, peer.profile.peer_port, self._timeout)
            except LateAnswer as exc:
                late = exc  # (a process was there: on the last address's failure, it was only late)
                if i == len(peer.addresses) - 1:
                    raise
            except ProfileExchangeError:
                if i == len(peer.addresses) - 1:
                    if late is not None:
                        raise late from None
                    raise
        raise ProfileExchangeError("no address")

    async def _poll_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            self._poll_now.clear()
            admitted = {p.endpoint for p in self._table.peers.values()}
            candidates = {e for e in self._static + [known[0] for known in self._mdns_endpoints.values()]
                          if (e.host, e.port) not in admitted}
            asked = self._backoff.due(candidates)  # endpoints that keep failing are asked less and less
            answered = await poll_endpoints(asked, max(self._timeout, 1.0), self._fetch)
            for endpoint in set(asked) - {e for e, _ in answered}:
                self._backoff.failed(endpoint)
            for endpoint, profile in answered:
                self._backoff.answered(endpoint)
                self._gone_instances.discard(profile.instance)
                self._observe(profile, self._addresses_of(endpoint, profile), endpoint.source)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._poll_now.wait(), max(0.0, self._interval - (loop.time() - started)))

    def _addresses_of(self, endpoint: Endpoint, profile: NodeProfile) -> tuple[str, ...]:
        """Where a peer that answered at `endpoint` is: that address first, then the others of the mDNS
        records that name it there (a closed swarm's records are hints, and its profile is proved at one
        address only; every link's hello proves the secret again wherever it is dialed, so an address
        that is not the peer's only fails there: path choice moves off it)."""
        more = [address for e, node_id, instance, _, addresses in self._mdns_endpoints.values()
                if node_id == profile.node_id and instance == profile.instance and e.port == endpoint.port
                and endpoint.host in addresses for address in addresses]
        return tuple(dict.fromkeys([endpoint.host, *more]))[:MAX_ADDRESSES]

    # -- events ---------------------------------------------------------
    def _emit(self, events: list[PeerEvent]) -> None:
        for event in events:
            log.info("%s %s %s", event.kind, event.node_id, event.profile.name)
            self._events.put_nowait(event)

    async def _dispatch_events(self) -> None:
        # One consumer keeps events in order even when the callback is async.
        while True:
            event = await self._events.get()
            sink = self._on_event
            if sink is None:
                continue
            if isinstance(sink, asyncio.Queue):
                sink.put_nowait(event)
                continue
            try:
                result = sink(event)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("discovery event callback failed for %s", event)
