"""Node profiles over proved peer links: discovery's profile fetch and liveness probe, as a node does them.

discovery/ knows nothing of the transport (it must not import swarm/). A node hands
its Discovery a `ProfileFetcher` as `fetch_profile`: every profile that enters its
view, and every liveness probe (every 0.75 s per peer), is then a "profile" link
(handshake.dial_stream): the hello proves the swarm secret when there is one, the
profile comes sealed, and it must name the node the hello proved. An mDNS record
or a `--peer` only names an endpoint to ask. The answering side is the listener's
"profile" purpose (`serve_profile`): one frame, then the link closes.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from discovery.profile import MalformedProfile, NodeProfile
from discovery.profile_exchange import MAX_PROFILE_BYTES, ProfileExchangeError, exchange_error

from .errors import ProtocolError
from .handshake import dial_stream
from .link_handshake import LinkAuth
from .stream_link import StreamFrameLink

PROFILE_PURPOSE = "profile"


def serve_profile(current: Callable[[], NodeProfile]):
    """The listener's handler for "profile" links: our profile as it is now."""
    async def handler(link: StreamFrameLink) -> None:
        await link.send({"t": "profile"}, current().to_json().encode())
    return handler


class ProfileFetcher:
    """`fetch_profile(host, port, timeout)` for discovery: the profile of the node at that endpoint."""

    def __init__(self, auth: LinkAuth) -> None:
        self.auth = auth

    async def __call__(self, host: str, port: int, timeout: float) -> NodeProfile:
        connected: list[bool] = []
        try:
            return await asyncio.wait_for(self._fetch(host, port, timeout, connected), timeout)
        except ProfileExchangeError:
            raise
        except (asyncio.TimeoutError, OSError, ProtocolError) as exc:
            raise exchange_error(host, port, exc, bool(connected)) from None

    async def _fetch(self, host: str, port: int, timeout: float, connected: list[bool]) -> NodeProfile:
        link = await dial_stream((host, port), self.auth, PROFILE_PURPOSE, timeout=timeout,
                                 max_payload=MAX_PROFILE_BYTES, connected=lambda: connected.append(True))
        try:
            frame = await link.receive()
        finally:
            await link.close()
        if frame.header["t"] != "profile":
            raise ProfileExchangeError(f"{host}:{port}: expected a profile, got {frame.header['t']!r}")
        try:
            profile = NodeProfile.from_json(bytes(frame.payload))
        except MalformedProfile as exc:
            raise ProfileExchangeError(f"{host}:{port}: {exc}") from None
        if profile.node_id != link.peer:
            raise ProfileExchangeError(f"{host}:{port}: node {link.peer} sent the profile of {profile.node_id}")
        return profile
