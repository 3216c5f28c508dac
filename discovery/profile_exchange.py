"""SWPF: ask a node for its profile over its peer port.

This is how static peers (no multicast: VPNs, other subnets) are learned and
how a peer that was declared gone is re-admitted.

Wire format (TCP, on the peer port):
    client -> server: the 4 bytes b"SWPF"
    server -> client: 4-byte big-endian length N, then N bytes of UTF-8 JSON
                      (NodeProfile.to_dict()), then the server closes.

The peer port belongs to the node's transport, which routes connections by
their first bytes: when it reads MAGIC it must call `answer_profile_request`
with the same reader/writer (the magic already consumed).
"""

from __future__ import annotations

import asyncio
import errno
import struct

from .profile import MalformedProfile, NodeProfile

MAGIC = b"SWPF"
MAX_PROFILE_BYTES = 64 * 1024
_LENGTH = struct.Struct(">I")


class ProfileExchangeError(Exception):
    """The peer could not be reached or did not answer with a valid profile."""


class OwnResourcesExhausted(ProfileExchangeError):
    """This node could not even try: it is out of descriptors, buffers or memory (says nothing of the peer)."""


class LateAnswer(ProfileExchangeError):
    """The peer's host took the connection but no answer came in time: a process is listening there, only
    slow (a machine whose cores are all busy). Not the refusal or silence of a dead node or a lost link."""


OWN_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def exchange_error(host: str, port: int, exc: BaseException, connected: bool = False) -> ProfileExchangeError:
    """The ProfileExchangeError for a failed fetch: OwnResourcesExhausted where the failure was ours,
    LateAnswer where the time ran out after the connection was made."""
    if getattr(exc, "errno", None) in OWN_RESOURCE_ERRNOS:
        kind = OwnResourcesExhausted
    elif connected and isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        kind = LateAnswer
    else:
        kind = ProfileExchangeError
    return kind(f"{host}:{port}: {type(exc).__name__}: {exc}")


async def answer_profile_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, profile: NodeProfile
) -> None:
    """Send `profile` to a client that has sent MAGIC (already read), then close."""
    del reader  # nothing more to read: the request is the magic alone
    body = profile.to_json().encode()
    try:
        writer.write(_LENGTH.pack(len(body)) + body)
        await writer.drain()
    except (ConnectionError, OSError):
        pass  # the asker went away; nothing to do
    finally:
        await _close(writer)


async def fetch_profile(host: str, port: int, timeout: float = 1.0) -> NodeProfile:
    """Connect to host:port, request the profile, return it (ProfileExchangeError otherwise)."""
    connected: list[bool] = []
    try:
        return await asyncio.wait_for(_fetch(host, port, connected), timeout)
    except ProfileExchangeError:
        raise
    except (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
        raise exchange_error(host, port, exc, bool(connected)) from exc


async def _fetch(host: str, port: int, connected: list[bool]) -> NodeProfile:
    reader, writer = await asyncio.open_connection(host, port)
    connected.append(True)
    try:
        writer.write(MAGIC)
        await writer.drain()
        (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
        if length > MAX_PROFILE_BYTES:
            raise ProfileExchangeError(f"{host}:{port}: profile of {length} bytes is too large")
        body = await reader.readexactly(length)
    finally:
        await _close(writer)
    try:
        return NodeProfile.from_json(body)
    except MalformedProfile as exc:
        raise ProfileExchangeError(f"{host}:{port}: {exc}") from exc


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass  # the other side went away first; closed all the same
