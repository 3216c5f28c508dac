"""Opening the link to a peer (connect + hello), and the frames that wait for it: off the MLX thread.

A connect waits on the peer: on a host that is slow to accept or to answer the hello, up to
the connect timeout. The MLX thread computes every stage's pass and carries every other
peer's frames (lane.py), so it must never wait there: `open_link` runs on a thread of its own
(`LinkOpener.start`), the frames for that peer wait in order (`HeldFrames`), and the result
is posted back to the MLX thread, which sends them.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Callable, NamedTuple

from .connection import PeerConnection, QueueFull
from .errors import HandshakeRejected, PeerUnreachable, ProtocolError
from .handshake import dial
from .link_handshake import LinkAuth
from .links import PeerLinks

log = logging.getLogger("swarm.transport")


class Opened(NamedTuple):
    conn: PeerConnection
    replaced: PeerConnection | None  # the link it replaces: retire it
    ours: bool  # we dialed it (else the peer's arrived: the listener hands it over, read from there)


def open_link(links: PeerLinks, auth: LinkAuth, node_id: str, addresses: list[tuple[str, int]], timeout: float,
              max_payload: int) -> Opened:
    """The link to `node_id`: one that arrives meanwhile, or one we dial, at the first of `addresses` (best
    first: path_choice.py) that answers. Waits (any thread but the MLX thread's); PeerUnreachable when there
    is none within `timeout` per address (twice, if the peer is dialing us at the same moment)."""
    try:
        conn = links.begin_dial(node_id, timeout)
    except TimeoutError as exc:
        raise PeerUnreachable(node_id, str(exc)) from None
    if conn is not None:
        return Opened(conn, None, False)  # it connected to us meanwhile
    failures: list[str] = []
    duplicate = False
    try:
        for address in addresses:
            where = f"{address[0]}:{address[1]}"
            try:
                conn = dial(address, auth, node_id, timeout, max_payload)
                break
            except HandshakeRejected as exc:
                if exc.kind == "duplicate":
                    duplicate = True
                    break
                failures.append(f"{where}: {exc}")
            except (OSError, ProtocolError) as exc:
                failures.append(f"{where}: {type(exc).__name__}: {exc}")
    finally:
        replaced = links.end_dial(node_id, conn)
    if duplicate:  # the lower id is connecting to us, and its connection stays
        conn = links.wait_arrival(node_id, timeout)
        if conn is None:
            raise PeerUnreachable(node_id, f"{where} is connecting to us instead and did not arrive in time")
        return Opened(conn, None, False)
    if conn is None:
        raise PeerUnreachable(node_id, "; ".join(failures) or "no address to dial")
    if failures:
        log.warning("connected to %s at %s: %s", node_id, conn.where, "; ".join(failures))
    return Opened(conn, replaced, True)


class HeldFrames:
    """The frames for one peer whose link is being opened, in the order they were sent, bounded; `opened`
    resolves when the dial is over (to None, or PeerUnreachable), for a sender that must know."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.frames: list[tuple[dict, bytes]] = []
        self.size = 0
        self.opened: Future[None] = Future()

    def hold(self, header: dict, payload: bytes | memoryview) -> None:
        """QueueFull past `limit` bytes."""
        size = memoryview(payload).nbytes
        if self.size + size > self.limit:
            raise QueueFull(f"{self.size} bytes wait for its connection already")
        self.frames.append((header, bytes(payload)))  # a copy: a payload's buffer may be reused once we return
        self.size += size

    def settle(self, failed: PeerUnreachable | None) -> None:
        if not self.opened.done():  # (a sender that stopped waiting cancelled it)
            if failed is None:
                self.opened.set_result(None)
            else:
                self.opened.set_exception(failed)

    def clear(self) -> None:
        self.frames, self.size = [], 0


Done = Callable[[str, Opened | None, str | None], None]  # (peer, the link or None, what failed), MLX thread


class LinkOpener:
    """Opens links on threads of their own and posts each result to the MLX thread; once closed, a dial
    that ends closes what it opened (the MLX thread that would have may have stopped)."""

    def __init__(self, links: PeerLinks, auth: LinkAuth, timeout: float, max_payload: int,
                 post: Callable[..., None]) -> None:
        self.links, self.auth, self.timeout, self.max_payload, self._post = links, auth, timeout, max_payload, post
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Dials that end from now on close their links. (A link a dial registered before this is among
        the links the caller closes next.)"""
        with self._lock:
            self._closed = True

    def start(self, node_id: str, addresses: list[tuple[str, int]], done: Done) -> None:
        threading.Thread(target=self._open_on_dial_thread, args=(node_id, addresses, done), daemon=True,
                         name=f"dial {node_id}").start()

    def _open_on_dial_thread(self, node_id: str, addresses: list[tuple[str, int]], done: Done) -> None:
        try:
            opened = open_link(self.links, self.auth, node_id, addresses, self.timeout, self.max_payload)
        except PeerUnreachable as exc:
            self._post(done, node_id, None, exc.reason)
        except Exception as exc:  # a bug: reported as a failed dial, not a frame lost without a word
            self._post(done, node_id, None, f"dialing failed: {exc!r}")
        else:
            with self._lock:
                if not self._closed:
                    self._post(done, node_id, opened, None)
                    return
            if opened.ours:
                for conn in (opened.conn, opened.replaced):
                    if conn is not None:
                        self.links.remove(conn)
                        conn.close()
