"""The transport interface the coordinator programs against.

A transport moves frames (a msgpack-able header dict with a str "t", plus raw
payload bytes) between nodes named by node_id. It knows nothing about
stages, plans or tokens; the coordinator knows nothing about sockets.

Delivery contract:
  * `send` returns once the frame is handed to the OS (TCP: written and
    drained); it is not an end-to-end acknowledgement. Frames to one peer
    arrive in send order; there is no order across peers.
  * `on_message(sender_node_id, frame)` is awaited once per incoming frame, in
    arrival order per connection. It should only enqueue: while it runs, that
    connection is not read (which is the backpressure).
  * Every message type is delivered, including ones the transport does not
    know: the coordinator decides what to do with them. Only the handshake
    is consumed by the transport: "hello", and "error" as the first frame
    after it (see handshake.py), so name application errors differently.
  * A failure to deliver raises PeerUnreachable; the coordinator decides
    whether to retry, re-plan or fail the request.

RDMA (Thunderbolt 5 via MLX's jaccl backend) -- what an `RdmaTransport`
implementing this same interface would need; the coordinator must not change:
  * Connection setup/teardown at run time. `mx.distributed` groups are fixed
    when the group is initialised (all ranks, at once), but our plans change
    whenever nodes join or leave. Either re-form the group on each plan change
    (a barrier across all nodes; in-flight requests drained first), or, better,
    set up a queue pair per (sender, receiver) on first `send` and tear it
    down in `drop`, which is what this interface already assumes.
  * Registered (pinned) memory for activations: RDMA reads/writes only into
    memory registered with the NIC. Keep a small pool of registered buffers
    sized for the largest activation (1 x max_prefill x hidden x itemsize),
    receive into them, and hand `on_message` a memoryview of the buffer
    (returned to the pool once the coordinator has copied it into MLX).
  * A side channel for headers and control: the small msgpack headers, the
    hello/version/swarm checks and liveness could stay on this TCP transport;
    only payloads above a threshold go over RDMA, with the header naming the
    buffer/sequence number the payload landed in.
  * The same failure semantics: a dead link must surface as PeerUnreachable
    on `send`, not as a hang in a collective.
"""

from __future__ import annotations

import abc
from typing import Awaitable, Callable

from .frames import Frame

OnMessage = Callable[[str, Frame], Awaitable[None]]
Address = tuple[str, int]


class Transport(abc.ABC):
    node_id: str

    @abc.abstractmethod
    async def start(self, on_message: OnMessage) -> None:
        """Start receiving; `on_message(sender_node_id, frame)` gets every incoming frame."""

    @abc.abstractmethod
    async def send(self, node_id: str, address: Address, header: dict, payload: bytes | memoryview = b"") -> None:
        """Send one frame to `node_id` at `address`, connecting on first use.

        Raises PeerUnreachable on connect failure/timeout or a broken
        connection; the next send to that peer reconnects.
        """

    @abc.abstractmethod
    async def drop(self, node_id: str) -> None:
        """Close the connection to `node_id`, if any (it left the plan)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop receiving and close every connection."""
