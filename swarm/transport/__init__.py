"""Peer transport: frames between nodes (TCP today; see base.py for RDMA)."""

from .arrays import array_frame, decode_array, encode_array, frame_array
from .base import Address, OnMessage, Transport
from .errors import ConnectionClosed, HandshakeRejected, PeerUnreachable, ProtocolError
from .frames import DEFAULT_MAX_PAYLOAD_BYTES, MAGIC, MAX_HEADER_BYTES, Frame, encode_frame, read_frame
from .handshake import PROTOCOL_VERSION
from .tcp import TcpTransport

__all__ = [
    "Address",
    "ConnectionClosed",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "Frame",
    "HandshakeRejected",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "OnMessage",
    "PROTOCOL_VERSION",
    "PeerUnreachable",
    "ProtocolError",
    "TcpTransport",
    "Transport",
    "array_frame",
    "decode_array",
    "encode_array",
    "encode_frame",
    "frame_array",
]
