"""mDNS/DNS-SD: advertise our profile as `_swarm._tcp.local.` and browse for others.

Each process registers under its own instance name (`swarm-<instance>`), so two
nodes on one host, or a node and its restarted self, never fight over a name;
the node id lives in the TXT record. IPv4 only, which keeps address handling
simple on LANs (every LAN we target has IPv4).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Callable

import ifaddr
from zeroconf import InterfaceChoice, IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from .profile import SERVICE_TYPE, MalformedProfile, NodeProfile

log = logging.getLogger(__name__)

RESOLVE_TIMEOUT_MS = 3000

FoundCallback = Callable[[str, NodeProfile, tuple[str, ...]], None]
LostCallback = Callable[[str], None]


def resolve_interfaces(specs: list[str] | None) -> list[str] | None:
    """Interface names or IPv4 addresses -> IPv4 addresses (None stays None = all)."""
    if specs is None:
        return None
    by_name = {
        adapter.nice_name: [ip.ip for ip in adapter.ips if isinstance(ip.ip, str)]
        for adapter in ifaddr.get_adapters()
    }
    addresses: list[str] = []
    for spec in specs:
        try:
            socket.inet_aton(spec)
            addresses.append(spec)
        except OSError:
            if not by_name.get(spec):
                raise ValueError(f"no IPv4 address on interface {spec!r}") from None
            addresses.extend(by_name[spec])
    return addresses


def local_ipv4_addresses() -> list[str]:
    """Non-loopback IPv4 addresses of this host (loopback if there are none)."""
    found = [
        ip.ip
        for adapter in ifaddr.get_adapters()
        for ip in adapter.ips
        if isinstance(ip.ip, str) and not ip.ip.startswith("127.")
    ]
    return found or ["127.0.0.1"]


STARTUP_WAIT_S = 60.0  # how long zeroconf may take to start on a loaded machine

class MdnsAgent:
    def __init__(self, interfaces: list[str] | None, on_found: FoundCallback, on_lost: LostCallback) -> None:
        self.interfaces = interfaces
        self.addresses = interfaces or local_ipv4_addresses()
        self._on_found = on_found
        self._on_lost = on_lost
        self._azc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._resolving: dict[str, asyncio.Task[None]] = {}
        # An update racing the registration would be overwritten by the old
        # record when registration completes, so updates wait for it.
        self._registered = asyncio.Event()

    async def start(self, profile: NodeProfile) -> None:
        self._azc = AsyncZeroconf(
            interfaces=self.interfaces if self.interfaces else InterfaceChoice.All,
            ip_version=IPVersion.V4Only,
        )
        # zeroconf gives its own start 9 s, then registering raises NotRunningException: on a machine
        # with every core busy (32 nodes started at once on 2 cores) two nodes died of it at start.
        await self._azc.zeroconf.async_wait_for_start(timeout=STARTUP_WAIT_S)
        self._browser = AsyncServiceBrowser(self._azc.zeroconf, [SERVICE_TYPE], handlers=[self._on_change])
        self._info = self._service_info(profile)
        try:
            await (await self._azc.async_register_service(self._info, allow_name_change=True))
        finally:
            self._registered.set()

    async def update(self, profile: NodeProfile) -> None:
        await self._registered.wait()
        if self._azc is None or self._info is None:
            return
        self._info = self._service_info(profile, name=self._info.name)
        await (await self._azc.async_update_service(self._info))

    async def stop(self) -> None:
        for task in self._resolving.values():
            task.cancel()
        if self._browser is not None:
            await self._browser.async_cancel()
        if self._azc is not None:
            await self._azc.async_unregister_all_services()  # sends goodbyes
            await self._azc.async_close()
        self._azc = self._browser = None

    def _service_info(self, profile: NodeProfile, name: str | None = None) -> AsyncServiceInfo:
        instance = f"swarm-{profile.instance or profile.node_id}"
        return AsyncServiceInfo(
            SERVICE_TYPE,
            name or f"{instance}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(ip) for ip in self.addresses],
            port=profile.peer_port,
            properties=profile.to_txt(),
            server=f"{instance}.local.",
        )

    def _on_change(self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Removed:
            if task := self._resolving.pop(name, None):
                task.cancel()
            self._on_lost(name)
            return
        if self._info is not None and name == self._info.name:
            return  # ourselves
        if previous := self._resolving.get(name):
            previous.cancel()  # a newer change supersedes an unfinished resolve
        self._resolving[name] = asyncio.get_running_loop().create_task(self._resolve(service_type, name))

    async def _resolve(self, service_type: str, name: str) -> None:
        assert self._azc is not None
        info = AsyncServiceInfo(service_type, name)
        try:
            if not await info.async_request(self._azc.zeroconf, RESOLVE_TIMEOUT_MS):
                log.debug("could not resolve %s", name)
                return
            addresses = tuple(info.parsed_addresses(IPVersion.V4Only))
            profile = NodeProfile.from_txt(info.properties or {})
        except MalformedProfile as exc:
            log.debug("ignoring %s: %s", name, exc)  # another program's service, or a broken one
            return
        finally:
            if self._resolving.get(name) is asyncio.current_task():
                del self._resolving[name]
        if addresses:
            self._on_found(name, profile, addresses)
