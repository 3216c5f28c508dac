"""Links whose frames wait for their socket: a send never waits on a slow peer (lane.py).

What a socket does not take at once waits in its connection's own bounded queue (connection.py) and
leaves when the MLX thread's selector says the socket has room, in order. A link whose queue took no
bytes for `stall_timeout` is stalled: the lane breaks it like a dead one, and planning hears of it.
Without a selector of ours (a tool sending from one loop of its own), a send waits for room on the spot,
as long as the peer takes bytes.

MLX thread only, like the lane.
"""

from __future__ import annotations

import functools
import socket
import time
from typing import Callable, Protocol

from .connection import PeerConnection


class WriteWatch(Protocol):
    """The MLX thread's selector, as the lane uses it (engine/worker.py)."""

    def watch_writable(self, sock: socket.socket, on_writable: Callable[[], None] | None) -> None: ...

    def mlx_recheck_at(self, deadline: float) -> None: ...

    def after_events(self, fn: Callable[[], None]) -> None: ...

    def mlx_worked_since(self, then: float) -> float: ...


class WriteBacklog:
    def __init__(self, writes: WriteWatch | None, stall_timeout: float,
                 broke: Callable[[PeerConnection, str], None], stalled: Callable[[PeerConnection, str], None]):
        """`broke(conn, problem)`: a write failed; `stalled(conn, problem)`: its peer took nothing for too long."""
        self._writes, self.stall_timeout = writes, stall_timeout
        self._broke, self._stalled = broke, stalled
        self._waiting: set[PeerConnection] = set()
        if writes is not None:
            writes.after_events(self._mlx_check_stalls)

    def __contains__(self, conn: PeerConnection) -> bool:
        return conn in self._waiting

    def wait_for_room(self, conn: PeerConnection) -> None:
        """Bytes wait in `conn`'s queue: they leave when its socket has room (or it stalls)."""
        if self._writes is None:  # no selector of ours: wait here, as long as the peer takes bytes
            conn.flush_within(self.stall_timeout)
            return
        self._waiting.add(conn)
        self._writes.watch_writable(conn.sock, functools.partial(self._mlx_writable, conn))
        self._writes.mlx_recheck_at(time.monotonic() + self.stall_timeout)

    def discard(self, conn: PeerConnection) -> None:
        """`conn` is closed: nothing of it waits any more."""
        self._waiting.discard(conn)

    def _mlx_writable(self, conn: PeerConnection) -> None:
        try:
            done = conn.flush()
        except OSError as exc:
            self._broke(conn, f"connection broke: {type(exc).__name__}: {exc}")
            return
        if done:
            self._waiting.discard(conn)
            self._writes.watch_writable(conn.sock, None)

    def _mlx_check_stalls(self) -> None:
        """After each round of the MLX thread's events: a link whose queue took no bytes for too long stalls."""
        if not self._waiting:
            return
        now = time.monotonic()
        for conn in list(self._waiting):
            waited = conn.stalled_for(now)
            if waited >= self.stall_timeout:
                self._stalled(conn, f"it took no data for {waited:.1f} s ({conn.queued} bytes waiting)")
            else:
                self._writes.mlx_recheck_at(now + self.stall_timeout - waited)
