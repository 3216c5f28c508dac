"""Endpoints we poll for a profile: static peers and known-but-gone mDNS peers.

Static peers (`--peer HOST:PORT`) serve networks without multicast. The same
poll re-admits an mDNS peer that liveness declared gone (e.g. its link was
cut): a peer does not re-announce by itself, so we ask it for its profile. When
mDNS is only a hint, every mDNS peer is admitted this way. The
profile returned is whatever instance lives at the endpoint now, so a stale
record can never resurrect a dead instance.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

from .profile import NodeProfile
from .profile_exchange import ProfileExchangeError, fetch_profile

# (host, port, timeout) -> the profile of the node there; ProfileExchangeError when it cannot tell.
ProfileFetcher = Callable[[str, int, float], Awaitable[NodeProfile]]


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    source: str  # "static" | "mdns"

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_peer_address(spec: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port)."""
    host, sep, port_text = spec.rpartition(":")
    if not sep or not host:
        raise ValueError(f"peer must be HOST:PORT, got {spec!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bad port in {spec!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {spec!r}")
    return host, port


async def poll_endpoints(
    endpoints: Iterable[Endpoint], timeout: float, fetch: ProfileFetcher = fetch_profile
) -> list[tuple[Endpoint, NodeProfile]]:
    """Ask every endpoint for its profile concurrently; returns those that answered."""
    endpoints = list(endpoints)

    async def ask(endpoint: Endpoint) -> NodeProfile | None:
        try:
            return await fetch(endpoint.host, endpoint.port, timeout)
        except ProfileExchangeError:
            return None

    profiles = await asyncio.gather(*(ask(e) for e in endpoints))
    return [(e, p) for e, p in zip(endpoints, profiles) if p is not None]
