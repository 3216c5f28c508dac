"""The data lane: every peer frame is read and written here, by the MLX thread itself.

This is the node's transport interface: `mlx_send(node_id, message)` and the
`on_message(sender, message)` handler given to `serve` (node/inbox.py).
It knows messages and connections, nothing of plans or stages.

A pipeline stage idles while the others compute, and on an idle machine every
thread wake-up and every cold line of asyncio is a visible part of a hop.
So the thread that computes also reads
its input and writes its output: a decode step arrives, is computed and leaves
without waking another thread (benchmarks/lean_pipeline.py measures the floor).

- One connection per peer, in both directions (links.py): sending uses the one
  there is, whoever opened it, and dials (connect + hello, within the connect
  timeout) only when there is none: on a thread of its own (link_opener.py), while
  that peer's frames wait in order and every other peer's go on; a dial that fails
  is reported like a link that broke (`on_broken`). A peer with several addresses is
  dialed at the best one first, then the others in turn (`endpoints_of`: the path
  choice, node/path_choice.py, which also moves a link off an address that stopped
  answering or onto a clearly faster one: `mlx_path_failed`, `mlx_path_faster`).
  Connections the peer opened come from the listener (listener.py: accepted and
  answered on the event loop) through `take_over`.
- Every frame that comes in is decoded into a typed message here (messages.py),
  once, with the sender's node id known from the hello; a malformed one closes its
  connection with one log line, and nobody else notices.
- A send never waits on a slow peer: what its socket does not take at once waits in that
  link's own bounded queue (connection.py) and leaves when the socket has room (the MLX
  thread's selector says so: `writes`, write_backlog.py), in order. A link whose queue took no bytes for
  `stall_timeout`, or outgrows its bound, is broken like a dead one, and `on_stalled` is
  told too: planning leaves that peer out (planning/slow_members.py).
- With a swarm secret every link was proved in its hello and every frame on it is
  sealed (connection.py); a frame that does not open is garbage like any other.
- A link that breaks (garbage, a frame that does not open, a reset, a failed write) is
  closed with a reset, so the peer sees a break and not a clean end, and `on_broken`
  is told: frames sent on it may be lost, so the entry replays what it waits for.
- A link that carried nothing for `idle_timeout` is retired (no more writes from us,
  its last frames read): a peer, or a stranger in an open swarm, holds no idle
  connection for long; the next frame to that peer dials a new one. The listener's
  timer calls `retire_idle` (the MLX thread has no timers of its own).
- For tests, frames to some peers (or over links on some addresses) can be held back a fixed
  time before they are written (frame_hold.py, SWARM_HOLD_FRAMES): a slow link without netem,
  paid by every frame.
- A Pong that cannot leave at once (its link is being opened, or bytes wait for its socket,
  or it was held and this thread's work kept it past its time) leaves marked as having
  waited (ping_messages.py): whatever kept it, this thread's passes may have, and they are
  no part of the link's round trip.
- A message to this node itself is handed to the handler directly: the entry's own
  steps into its own stage 0, the last stage's token for its own request.

Runs on the MLX thread (engine/worker.py), except `take_over` (any thread): hence
the `mlx_` names. Not thread-safe and does not need to be; links.py is.

An RDMA lane would plug in here: docs/accelerators.md says what it would need.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import time
from concurrent.futures import Future
from typing import Callable

from ..engine.busy_spans import SLIGHT_S
from . import hop_trace
from .connection import DEFAULT_QUEUE_LIMIT, PeerConnection, QueueFull
from .errors import PeerUnreachable, ProtocolError
from .frame_hold import FrameHold
from .frames import DEFAULT_MAX_PAYLOAD_BYTES
from .link_handshake import LinkAuth
from .link_opener import HeldFrames, LinkOpener, Opened, open_link
from .links import PeerLinks
from .handshake_messages import HANDSHAKE_MESSAGES, Rejection
from .messages import Forward, Message, Token, decode
from .ping_messages import Pong
from .write_backlog import WriteBacklog, WriteWatch

log = logging.getLogger("swarm.transport")
_TRACING = hop_trace.enabled()  # read once: off, the hop pays one global lookup for it

OnMessage = Callable[[str, Message], None]  # (sender node id, message), on the MLX thread
Watch = Callable[[socket.socket, Callable[[], None] | None], None]  # register (callback) or forget (None)
Post = Callable[..., None]  # run a function on the MLX thread (MlxWorker.post)
OnBroken = Callable[[str, str], None]  # (peer node id, what broke), on the MLX thread
DEFAULT_CONNECT_TIMEOUT = 2.0
DEFAULT_STALL_TIMEOUT = 4.0  # a link whose waiting bytes the peer takes none of for this long is broken
DEFAULT_IDLE_TIMEOUT = 60.0
RETIRED_GRACE_S = 10.0  # a retired link whose peer never closes its end is closed after this
# A link moves to a faster address only after this long without a frame: frames on the old link and the
# new one could otherwise be read out of order.
MOVE_IDLE_S = 0.5


class DataLane:
    def __init__(self, node_id: str, swarm: str, links: PeerLinks, watch: Watch, post: Post,
                 address_of: Callable[[str], tuple[str, int] | None], *,
                 max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 stall_timeout: float = DEFAULT_STALL_TIMEOUT, key: bytes | None = None,
                 on_broken: OnBroken | None = None, auth: LinkAuth | None = None,
                 writes: WriteWatch | None = None, queue_limit: int = DEFAULT_QUEUE_LIMIT,
                 hold: FrameHold | None = None,
                 endpoints_of: Callable[[str], list[tuple[str, int]]] | None = None) -> None:
        """`key`: the stretched swarm secret (link_crypto.stretch_secret); None: an open swarm. `auth`: the
        node's (one for all its handshakes), else one of the lane's own from `key`. `writes`: the MLX
        thread's selector, for sends the socket could not take at once and links being opened; None: such a
        send waits for room (at most `stall_timeout`), and a dial for its hello, on the spot (tools that send
        from one loop of their own). `hold`: frames to some peers held back a while (frame_hold.py, tests;
        needs `writes`). `endpoints_of`: a peer's endpoints, the one to dial first first (empty: not in the
        view); None: `address_of`'s alone."""
        self.node_id, self.swarm, self.links = node_id, swarm, links
        self.auth = auth or LinkAuth(node_id, swarm, key)
        self._on_broken = on_broken
        self._watch, self._post = watch, post
        self._endpoints_of = endpoints_of or (lambda peer: [e] if (e := address_of(peer)) is not None else [])
        self.max_payload = max_payload
        self.connect_timeout, self.stall_timeout, self.queue_limit = connect_timeout, stall_timeout, queue_limit
        self._writes = writes
        self._backlog = WriteBacklog(writes, stall_timeout, self._close, self._stalled)
        self._opener = LinkOpener(links, self.auth, connect_timeout, max_payload, post)
        self._opening: dict[str, HeldFrames] = {}  # peers whose link is being opened, and what waits for it
        self._hold = hold if writes is not None else None
        if self._hold is not None:
            writes.after_events(self._mlx_release_held)
        self._on_message: OnMessage | None = None
        self._on_stalled: OnBroken | None = None
        self._watched: set[PeerConnection] = set()
        self._corked: list[PeerConnection] | None = None  # links written inside mlx_sending_together
        self._closed = False

    def serve(self, on_message: OnMessage, on_broken: OnBroken | None = None,
              on_stalled: OnBroken | None = None) -> None:
        """From now on, every message for this node goes to `on_message`, every link that breaks is
        reported to `on_broken`, and a peer that took no data for `stall_timeout` to `on_stalled` as well
        (set once, at start)."""
        self._on_message = on_message
        if on_broken is not None:
            self._on_broken = on_broken
        self._on_stalled = on_stalled

    # -- any thread -------------------------------------------------------------------------
    def take_over(self, conn: PeerConnection, replaced: PeerConnection | None) -> None:
        """A connection the peer opened is now the link (links.arrived): read it from now on."""
        self._post(self._take_over_on_mlx_thread, conn, replaced)

    def retire_idle(self, idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
        """Retire links that carried nothing for `idle_timeout` s; close retired ones the peer never closed."""
        self._post(self._mlx_retire_idle, idle_timeout)

    # -- MLX thread: sending ----------------------------------------------------------------
    def mlx_send(self, node_id: str, message: Message) -> None:
        """Deliver `message` to `node_id` (this node: to the handler); PeerUnreachable if it cannot be."""
        if node_id == self.node_id:
            self._deliver(node_id, message, message.to_frame()[0] if _TRACING else None)
            return
        if self._hold is not None and (delay := self._hold.delay_for(node_id, self._mlx_host_of(node_id))) > 0:
            due = time.monotonic() + delay
            self._hold.hold(due, node_id, message)
            self._writes.mlx_recheck_at(due)
            return
        self._mlx_send_now(node_id, message)

    def _mlx_host_of(self, node_id: str) -> str | None:
        """The address frames to `node_id` go to now: its link's, else the one a dial tries first."""
        conn = self.links.link(node_id)
        if conn is not None:
            return conn.host
        endpoints = self._endpoints_of(node_id)
        return endpoints[0][0] if endpoints else None

    def _mlx_send_now(self, node_id: str, message: Message) -> None:
        held = self._opening.get(node_id)
        if held is None:
            conn = self._link(node_id)
            if conn is None:
                held = self._opening[node_id] = HeldFrames(self.queue_limit)
        if type(message) is Pong and (held is not None or conn in self._backlog):
            message = message.waited()
        header, payload = message.to_frame()
        if held is not None:
            try:
                held.hold(header, payload)
            except QueueFull as exc:
                raise PeerUnreachable(node_id, f"its connection is being opened: {exc}") from None
        else:
            self._write(node_id, conn, header, payload)
        if _TRACING:
            hop_trace.mark(hop_trace.STEP_START if self._starts_a_step(message) else "sent", header)

    def _mlx_release_held(self) -> None:
        """After each round of events: send the held frames that are due (frame_hold.py)."""
        if self._closed:
            return
        after = self._hold.release_due(time.monotonic(), self._mlx_send_held)
        if after is not None:
            self._writes.mlx_recheck_at(after)

    def _mlx_send_held(self, node_id: str, message: Message, due: float) -> None:
        if type(message) is Pong and self._writes.mlx_worked_since(due) > SLIGHT_S:
            message = message.waited()
        try:
            self._mlx_send_now(node_id, message)
        except PeerUnreachable as exc:  # its sender has moved on: told like a link that broke
            self._report_broken(node_id, str(exc))

    def _write(self, node_id: str, conn: PeerConnection, header: dict, payload: bytes | memoryview) -> None:
        if self._corked is not None and conn not in self._corked:
            conn.cork(True)
            self._corked.append(conn)
        try:
            if not conn.write_frame(header, payload) and conn not in self._backlog:
                self._backlog.wait_for_room(conn)
        except QueueFull as exc:
            problem = f"it does not keep up: {exc}"
            self._stalled(conn, problem)
            raise PeerUnreachable(node_id, problem) from exc
        except OSError as exc:  # a half-written frame leaves the link unusable
            problem = f"connection broke: {type(exc).__name__}: {exc}"
            self._close(conn, problem)
            raise PeerUnreachable(node_id, problem) from exc

    def mlx_opening(self, node_id: str) -> Future[None] | None:
        """While the link to `node_id` is being opened: its dial's outcome (None, or PeerUnreachable),
        for a sender that must know whether what it sent there left (lane_probe.py)."""
        held = self._opening.get(node_id)
        return held.opened if held is not None else None

    def _stalled(self, conn: PeerConnection, problem: str) -> None:
        """`conn`'s peer takes no data: the link is broken, and planning hears of it."""
        was_link = self.links.link(conn.peer) is conn
        self._close(conn, problem)
        if was_link and self._on_stalled is not None:
            try:
                self._on_stalled(conn.peer, problem)
            except Exception:
                log.exception("on_stalled(%s)", conn.peer)

    @contextlib.contextmanager
    def mlx_sending_together(self):
        """The frames sent inside leave as few segments as the kernel can make (TCP_CORK), so a peer
        reads the rows of one batched pass in one go and queues them side by side for its own batch,
        rather than waking on the first and computing it alone."""
        if self._corked is not None:
            yield
            return
        self._corked = []
        try:
            yield
        finally:
            corked, self._corked = self._corked, None
            for conn in corked:
                conn.cork(False)  # (sends what the kernel held back)

    def mlx_break(self, node_id: str, problem: str) -> None:
        """Our link to `node_id` is of no use (what waits on it may never be read): closed as broken."""
        self._forget_held(node_id)
        conn = self.links.link(node_id)
        if conn is not None:
            self._close(conn, problem)

    def mlx_path_failed(self, node_id: str, address: str, problem: str) -> None:
        """`node_id` stopped answering at `address` (path_choice.py): a link on it is broken (what was sent
        on it may never be read: `on_broken` is told); the next frame dials its next address."""
        conn = self.links.link(node_id)
        if conn is not None and conn.host == address:
            self._close(conn, problem)

    def mlx_path_faster(self, node_id: str, address: str) -> None:
        """`address` is clearly the fastest of `node_id`'s (path_choice.py): a link we dialed elsewhere is
        retired once idle (its last frames are read), and the next frame dials `address`. A link the peer
        dialed is its choice of our addresses, and stays."""
        conn = self.links.link(node_id)
        if (conn is not None and conn.dialed and conn.host != address
                and time.monotonic() - conn.last_active > MOVE_IDLE_S and conn not in self._backlog):
            log.info("moving the link to %s from %s to %s", node_id, conn.host, address)
            self._retire(conn)

    def mlx_drop(self, node_id: str) -> None:
        """The peer left: close our connection to it."""
        self._forget_held(node_id)
        conn = self.links.link(node_id)
        if conn is not None:
            self._close(conn, None)

    def mlx_close(self) -> None:
        self._closed = True
        self._opener.close()
        for node_id, held in self._opening.items():  # (their dials' results may never be run)
            held.settle(PeerUnreachable(node_id, "the node is stopping"))
        self._opening.clear()
        for conn in {*self._watched, *self.links.all()}:
            self._close(conn, None)

    def _forget_held(self, node_id: str) -> None:
        held = self._opening.get(node_id)
        if held is not None:  # (its link, once open, carries nothing of what was held)
            held.clear()

    def _link(self, node_id: str) -> PeerConnection | None:
        """The link to `node_id`; None: it is being opened (off this thread, see link_opener.py)."""
        endpoints = self._endpoints_of(node_id)
        if not endpoints:
            raise PeerUnreachable(node_id, "not in this node's view of the swarm")
        conn = self.links.link(node_id)
        if conn is not None and conn.peer_closed():
            # The peer restarted or hung up: a write would vanish into a dead socket. A reset says the
            # link broke (frames on it may be lost), a clean end that it was retired.
            self._close(conn, conn.hangup())
            conn = None
        if conn is not None:
            return conn
        if self._writes is None:  # a tool's own loop: nothing else waits on this thread
            return self._mlx_opened(node_id, open_link(self.links, self.auth, node_id, endpoints,
                                                       self.connect_timeout, self.max_payload))
        self._opener.start(node_id, endpoints, self._mlx_dialed)
        return None

    def _mlx_dialed(self, node_id: str, opened: Opened | None, problem: str | None) -> None:
        """A dial is over: send what waited for it, or report the link broken (its frames are lost)."""
        held = self._opening.pop(node_id, None) or HeldFrames(0)
        if self._closed:
            if opened is not None and opened.ours:
                self._close(opened.conn, None)
            held.settle(PeerUnreachable(node_id, "the node is stopping"))
            return
        if opened is None:
            log.warning("could not connect to %s: %s", node_id, problem)
            held.settle(PeerUnreachable(node_id, problem))
            if held.frames:
                self._report_broken(node_id, f"could not connect: {problem}")
            return
        conn = self._mlx_opened(node_id, opened)
        held.settle(None)
        for header, payload in held.frames:
            try:
                self._write(node_id, conn, header, payload)
            except PeerUnreachable:
                return  # the link was closed as broken, and on_broken told

    def _mlx_opened(self, node_id: str, opened: Opened) -> PeerConnection:
        if opened.ours:
            self._read(opened.conn)
            if opened.replaced is not None:
                log.warning("two connections to %s: keeping the newer one", node_id)
                self._retire(opened.replaced)
        return opened.conn

    # -- MLX thread: receiving --------------------------------------------------------------
    def _take_over_on_mlx_thread(self, conn: PeerConnection, replaced: PeerConnection | None) -> None:
        if self._closed:  # answered while the node was stopping
            self._close(conn, None)
            return
        self._read(conn)
        if replaced is not None:
            self._retire(replaced)

    def _read(self, conn: PeerConnection) -> None:
        conn.queue_limit = self.queue_limit
        self._watched.add(conn)
        self._watch(conn.sock, functools.partial(self._readable, conn))
        if conn.has_pending:  # bytes that came with the hello: no readiness event will announce them
            self._readable(conn)

    def _retire(self, conn: PeerConnection) -> None:
        """No more writes from us: the peer reads to our end and closes; we read its last frames, then close."""
        self.links.remove(conn)
        conn.retired_at = time.monotonic()
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn, None)

    def _mlx_retire_idle(self, idle_timeout: float) -> None:
        now = time.monotonic()
        for conn in list(self._watched):
            if conn.retired_at is not None:
                if now - conn.retired_at > RETIRED_GRACE_S:
                    self._close(conn, None)
            elif now - conn.last_active > idle_timeout:
                log.debug("retiring the idle link %s %s (%s)", "to" if conn.dialed else "from", conn.where, conn.peer)
                self._retire(conn)

    def _readable(self, conn: PeerConnection) -> None:
        try:
            frames = conn.read_frames()
        except (ProtocolError, OSError) as exc:
            self._close(conn, str(exc))
            return
        if frames is None:
            self._close(conn, None)
            return
        for frame in frames:
            try:
                message = decode(frame)
            except ProtocolError as exc:
                self._close(conn, str(exc))
                return
            if isinstance(message, HANDSHAKE_MESSAGES):  # the peer refused our hello, or garbled the protocol
                self._close(conn, f"peer says: {message.message}" if isinstance(message, Rejection)
                            else f"a {message.T!r} frame after the handshake")
                return
            try:
                self._deliver(conn.peer, message, frame.header)
            except Exception as exc:  # the handler's bug: noticed, and it costs this connection only
                log.exception("handling a %s from %s", type(message).__name__, conn.peer)
                self._close(conn, f"the handler raised {exc!r}")
                return

    def _deliver(self, sender: str, message: Message, header: dict | None) -> None:
        if _TRACING:
            hop_trace.mark(hop_trace.STEP_END if isinstance(message, Token) else
                           hop_trace.STEP_START if self._starts_a_step(message) else "received", header)
        self._on_message(sender, message)

    def _starts_a_step(self, message: Message) -> bool:
        """This node, the entry, sending a sampled step into stage 0: where the hop trace cuts steps."""
        return (isinstance(message, Forward) and message.start == 0 and message.sampling is not None
                and message.entry == self.node_id)

    def _close(self, conn: PeerConnection, problem: str | None) -> None:
        """Close `conn`; with a `problem`, as a broken link: logged, reset, and `on_broken` told."""
        if problem:
            log.warning("closing peer connection %s %s (%s): %s", "to" if conn.dialed else "from", conn.where,
                        conn.peer, problem)
        was_link = self.links.link(conn.peer) is conn
        self.links.remove(conn)
        self._backlog.discard(conn)
        if conn in self._watched:
            self._watched.discard(conn)
            try:
                self._watch(conn.sock, None)
            except (KeyError, ValueError):
                pass  # already closed
        conn.close(abort=bool(problem))
        if problem and was_link:
            self._report_broken(conn.peer, problem)

    def _report_broken(self, peer: str, problem: str) -> None:
        if self._on_broken is not None:
            try:
                self._on_broken(peer, problem)
            except Exception:
                log.exception("on_broken(%s)", peer)
