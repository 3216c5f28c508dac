"""Errors the transport raises; the coordinator only needs these two."""

from __future__ import annotations


class ProtocolError(Exception):
    """A peer sent something that is not our wire protocol (or not this version/swarm)."""


class ConnectionClosed(ProtocolError):
    """The peer closed the connection cleanly, between two frames."""


class HandshakeRejected(ProtocolError):
    """The hello exchange failed: wrong protocol version, wrong swarm or wrong node."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class PeerUnreachable(Exception):
    """A frame could not be delivered to `node_id` (connect failed, timed out or broke)."""

    def __init__(self, node_id: str, reason: str) -> None:
        super().__init__(f"peer {node_id} unreachable: {reason}")
        self.node_id = node_id
        self.reason = reason
