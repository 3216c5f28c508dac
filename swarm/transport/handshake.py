"""The hello exchange that opens every SWRM connection.

    client -> server: MAGIC, {"t": "hello", "v": 1, "node_id": ..., "swarm": ...}
    server -> client: its own hello, or {"t": "error", "kind": ..., "message": ...} and close

The client checks the server's hello in turn; if it rejects it, the error
frame is the first (and last) frame the server reads after the handshake.
So "error" is reserved for the handshake: the coordinator should name its
own failure messages differently.

The server validates before answering, so a rejected client learns why from
the reply instead of from a silently closed socket. Error kinds: "version",
"swarm", "protocol" (not a hello at all), and "node" (the client reached a
different node than it meant to: the address was reused by another node).
"""

from __future__ import annotations

import asyncio
from typing import Any

from discovery.profile import COMPATIBLE_PROTOCOL_VERSIONS, PROTOCOL_VERSION

from .errors import HandshakeRejected, ProtocolError
from .frames import MAGIC, Frame, encode_frame, read_frame

HANDSHAKE_TIMEOUT = 5.0
# A hello is tiny; anything bigger is not one.
_MAX_HELLO_PAYLOAD = 0


def hello_header(node_id: str, swarm: str) -> dict[str, Any]:
    return {"t": "hello", "v": PROTOCOL_VERSION, "node_id": node_id, "swarm": swarm}


def error_header(kind: str, message: str) -> dict[str, Any]:
    return {"t": "error", "kind": kind, "message": message}


def check_hello(frame: Frame, swarm: str) -> str:
    """The peer's node_id from its hello; HandshakeRejected if we must not talk to it."""
    header = frame.header
    if header["t"] != "hello":
        raise HandshakeRejected("protocol", f"expected a hello frame, got {header['t']!r}")
    version = header.get("v")
    if type(version) is not int or version not in COMPATIBLE_PROTOCOL_VERSIONS:
        raise HandshakeRejected(
            "version", f"protocol version {version!r} not in {sorted(COMPATIBLE_PROTOCOL_VERSIONS)}"
        )
    if header.get("swarm") != swarm:
        raise HandshakeRejected("swarm", f"swarm {header.get('swarm')!r} is not {swarm!r}")
    node_id = header.get("node_id")
    if not isinstance(node_id, str) or not node_id:
        raise HandshakeRejected("protocol", f"hello without a node_id: {header!r}")
    return node_id


def raise_if_rejected(first_frame: Frame) -> None:
    """Server side: the first frame after our hello may be the client's rejection of it."""
    if first_frame.header["t"] == "error":
        header = first_frame.header
        raise HandshakeRejected(str(header.get("kind")), f"peer says: {header.get('message')}")


async def _send(writer: asyncio.StreamWriter, header: dict[str, Any], prefix: bytes = b"") -> None:
    pieces = encode_frame(header)
    writer.writelines([prefix, *pieces] if prefix else pieces)
    await writer.drain()


async def _reject(writer: asyncio.StreamWriter, rejection: HandshakeRejected) -> None:
    """Tell the peer why, if it is still listening."""
    try:
        await asyncio.wait_for(_send(writer, error_header(rejection.kind, rejection.message)), 1.0)
    except (OSError, asyncio.TimeoutError):
        pass


async def accept_hello(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    node_id: str,
    swarm: str,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> str:
    """Server side, after MAGIC was read: returns the client's node_id.

    Raises ProtocolError (HandshakeRejected after telling the client why).
    """
    try:
        frame = await asyncio.wait_for(read_frame(reader, _MAX_HELLO_PAYLOAD), timeout)
        peer_id = check_hello(frame, swarm)
    except HandshakeRejected as rejection:
        await _reject(writer, rejection)
        raise
    except asyncio.TimeoutError as exc:
        raise ProtocolError(f"no hello within {timeout} s") from exc
    await _send(writer, hello_header(node_id, swarm))
    return peer_id


async def offer_hello(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    node_id: str,
    swarm: str,
    expected_peer: str,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> None:
    """Client side on a fresh connection: send MAGIC + hello, check the answer.

    Raises HandshakeRejected (ours or the server's) or ProtocolError.
    """
    async def exchange() -> Frame:
        await _send(writer, hello_header(node_id, swarm), prefix=MAGIC)
        return await read_frame(reader, _MAX_HELLO_PAYLOAD)

    try:
        frame = await asyncio.wait_for(exchange(), timeout)
    except asyncio.TimeoutError as exc:
        raise ProtocolError(f"no hello within {timeout} s") from exc
    raise_if_rejected(frame)
    try:
        peer_id = check_hello(frame, swarm)
        if peer_id != expected_peer:
            raise HandshakeRejected("node", f"address answered as node {peer_id!r}, not {expected_peer!r}")
    except HandshakeRejected as rejection:
        await _reject(writer, rejection)
        raise
