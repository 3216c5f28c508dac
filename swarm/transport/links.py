"""One frame connection per pair of peers, used in both directions: which one, and who may open it.

Any thread: the listener asks on the event loop (`admit`, `arrived`) while the lane
looks up and dials on the MLX thread (`link`, `begin_dial`, ...), so every decision
is taken under one lock; the hop's lookup is a plain dict read.

Two nodes that connect to each other at the same moment must end with one
connection, and no frame may be sent on the one that goes. The rule: of two live
connections between a pair, the one the lower node id opened stays; a node that
opens a new connection to a peer it already has one with has dropped the old one, so
the newer one from the same side stays. It is applied before any frame is sent on
the newcomer: the listener refuses a hello (Rejection "duplicate") that would lose,
and the higher node, refused, waits for the lower node's connection to arrive. So:

  * lower L dials while higher H dials: L's listener refuses H's hello (L is dialing);
    H's listener accepts L's; H, refused, uses L's connection when it has arrived.
  * a node dials while the peer's connection is being answered: it waits and uses that.
  * a connection replaced by a newer one from the same side, or by the lower node's, is
    retired by the lane: no more writes, its last frames read, then closed.
"""

from __future__ import annotations

import threading

from .connection import PeerConnection
from .handshake_messages import Rejection


class PeerLinks:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._cond = threading.Condition()
        self._links: dict[str, PeerConnection] = {}
        self._dialing: set[str] = set()  # we are opening a connection to these
        self._arriving: set[str] = set()  # their hello is being answered

    def link(self, peer: str) -> PeerConnection | None:
        """The connection in use to `peer` (one dict read: the hop takes no lock)."""
        return self._links.get(peer)

    def snapshot(self) -> dict[str, str]:
        """Peer -> who opened the connection in use ("dialed" by us or "answered")."""
        with self._cond:
            return {peer: "dialed" if c.dialed else "answered" for peer, c in sorted(self._links.items())}

    # -- the listener (event loop) ------------------------------------------------------------
    def admit(self, peer: str) -> Rejection | None:
        """May a connection the peer opened be the one? None reserves it until `arrived`/`withdraw`."""
        with self._cond:
            if peer == self.node_id:
                return Rejection("node", f"{peer} is this node's own id")
            if peer in self._arriving:
                return Rejection("duplicate", "another connection from you is being answered")
            if peer in self._dialing and self.node_id < peer:
                return Rejection("duplicate", f"{self.node_id} is connecting to you: the lower id's connection stays")
            current = self._links.get(peer)
            if current is not None and current.dialed and self.node_id < peer and not current.peer_gone():
                return Rejection("duplicate", f"{self.node_id} has a connection to you, opened by the lower id")
            self._arriving.add(peer)
            return None

    def withdraw(self, peer: str) -> None:
        """The admitted connection failed before it was answered."""
        with self._cond:
            self._arriving.discard(peer)
            self._cond.notify_all()

    def arrived(self, conn: PeerConnection) -> PeerConnection | None:
        """An admitted, answered connection is now the one to its peer; returns the one it replaces."""
        with self._cond:
            self._arriving.discard(conn.peer)
            replaced = self._links.get(conn.peer)
            self._links[conn.peer] = conn
            self._cond.notify_all()
            return replaced

    # -- the lane (MLX thread) ------------------------------------------------------------------
    def begin_dial(self, peer: str, timeout: float) -> PeerConnection | None:
        """The connection to use if there is one (or one being answered arrives within `timeout`);
        None: dial it, then call `end_dial`. TimeoutError if the one being answered never arrived."""
        with self._cond:
            if not self._cond.wait_for(lambda: peer not in self._arriving, timeout):
                raise TimeoutError(f"its connection to us was still being answered after {timeout} s")
            current = self._links.get(peer)
            if current is None:
                self._dialing.add(peer)
            return current

    def end_dial(self, peer: str, conn: PeerConnection | None) -> PeerConnection | None:
        """Our dial is over (`conn`: it succeeded); returns a connection it replaced, to retire."""
        with self._cond:
            self._dialing.discard(peer)
            replaced = None
            if conn is not None:
                replaced = self._links.get(peer)  # cannot happen by the rule above; retired if it does
                self._links[peer] = conn
            self._cond.notify_all()
            return replaced

    def wait_arrival(self, peer: str, timeout: float) -> PeerConnection | None:
        """The peer refused our dial because it is connecting to us: its connection, once here."""
        with self._cond:
            self._cond.wait_for(lambda: peer in self._links, timeout)
            return self._links.get(peer)

    def remove(self, conn: PeerConnection) -> None:
        """`conn` is closing: it is no longer the one (if it still was)."""
        with self._cond:
            if self._links.get(conn.peer) is conn:
                del self._links[conn.peer]

    def all(self) -> list[PeerConnection]:
        with self._cond:
            return list(self._links.values())
