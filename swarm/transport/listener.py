"""The peer port, on the event loop: accept, route by the first bytes, answer.

The port is shared with discovery, so every accepted connection is routed by its
first 4 bytes:
    b"SWRM"  -> the hello answered (handshake.answer: proved and sealed with a swarm
                secret), then by the hello's purpose:
                "data"   the connection is handed to the data lane (if links.py keeps
                         it), which reads and writes it from then on, on the MLX thread
                other    the handler given to `serve_purpose` gets a StreamFrameLink, on
                         the event loop ("profile": discovery's profile fetch and
                         liveness probe, peer_profiles.py; "weights": bulk transfers)
    b"SWPF"  -> the plain profile answer (discovery/profile_exchange.py), only in an
                open swarm: with a secret a profile is only told over a proved link
    nothing  -> a bare connect-and-close: closed quietly
    other    -> closed
Profiles and liveness stay here, on short connections of their own: they must not
wait for the MLX thread, or a long prefill would make this node look dead.

Nothing a stranger sends can exhaust the node: every connection takes a slot of the
ConnectionBudget (per remote address and in all, with a reserve for the addresses of
peers in the view: `is_member`) before anything is read, or is closed at once; a hello
must be complete within the handshake timeout (a stranger's: STRANGER_HELLO_S); an answered
link idle for `link_idle_timeout` is closed (here for purpose links; the lane's are
retired by the sweep this listener runs); and every line a connection can cause is
logged at a bounded rate (log_limit.py). A bad connection is closed; nobody else
notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable

from discovery.profile import NodeProfile
from discovery.profile_exchange import MAGIC as PROFILE_MAGIC
from discovery.profile_exchange import answer_profile_request

from .connection_budget import ConnectionBudget
from .errors import ConnectionClosed, HandshakeRejected, ProtocolError
from .frames import DEFAULT_MAX_PAYLOAD_BYTES, MAGIC, read_magic
from .handshake import HANDSHAKE_TIMEOUT, answer, take_socket
from .lane import DEFAULT_IDLE_TIMEOUT, DataLane
from .link_handshake import LinkAuth
from .links import PeerLinks
from .log_limit import LogLimiter
from .handshake_messages import Rejection
from .peer_profiles import PROFILE_PURPOSE, serve_profile
from .stream_link import StreamFrameLink

log = logging.getLogger("swarm.transport")

PurposeHandler = Callable[[StreamFrameLink], Awaitable[None]]
DATA_PURPOSE = "data"
IDLE_SWEEP_S = 5.0
STRANGER_HELLO_S = 2.0  # a hello from an address no peer in the view has: its slot is back soon
LOG_EVERY_S = 60.0


class PeerListener:
    def __init__(self, node_id: str, swarm: str, host: str, port: int, links: PeerLinks, lane: DataLane,
                 profile: Callable[[], NodeProfile] | None, *, key: bytes | None = None,
                 max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES, handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 budget: ConnectionBudget | None = None, link_idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 auth: LinkAuth | None = None, is_member: Callable[[str], bool] = lambda address: False,
                 on_proved: Callable[[str, str], None] = lambda peer, address: None) -> None:
        """`key`: the stretched swarm secret (None: an open swarm), as the lane's. `profile`: what the
        "profile" purpose (and, in an open swarm, the plain SWPF request) answers. `auth`: the node's (one
        for all its handshakes), else one of the listener's own from `key`. `is_member(address)`: a peer in
        the view has that address (its connections take the budget's reserve). `on_proved(peer, address)`:
        a hello from `address` proved the swarm secret as node `peer` (only with a `key`)."""
        self.node_id, self.swarm, self.host = node_id, swarm, host
        self.auth = auth or LinkAuth(node_id, swarm, key)
        self.port = port  # the bound port once started (port=0 picks one)
        self.links, self.lane, self.profile = links, lane, profile
        self.max_payload, self.handshake_timeout = max_payload, handshake_timeout
        self.budget = budget or ConnectionBudget()
        self.link_idle_timeout = link_idle_timeout
        self.is_member, self.on_proved = is_member, on_proved
        self._purposes: dict[str, PurposeHandler] = {}
        if profile is not None:
            self.serve_purpose(PROFILE_PURPOSE, serve_profile(profile))
        self._server: asyncio.Server | None = None
        self._serving: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None
        self._noise = LogLimiter(log)

    def serve_purpose(self, name: str, handler: PurposeHandler) -> None:
        """From now on, a peer's link opened for `name` (handshake.dial_stream) goes to `handler`, on the
        event loop; the link is closed when the handler returns (an exception: logged, link closed)."""
        if name == DATA_PURPOSE or not name.isidentifier():
            raise ValueError(f"cannot serve a purpose named {name!r}")
        self._purposes[name] = handler

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve_connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = asyncio.create_task(self._sweep_idle_links(), name="peer-link-idle-sweep")

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._serving):  # before wait_closed: from 3.12 on it waits for them
            task.cancel()
        await asyncio.gather(*self._serving, *([self._sweeper] if self._sweeper else []), return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _sweep_idle_links(self) -> None:
        while True:
            await asyncio.sleep(IDLE_SWEEP_S)
            self.lane.retire_idle(self.link_idle_timeout)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        host = peer[0] if peer else "?"
        where = f"{peer[0]}:{peer[1]}" if peer else "?"
        member = self.is_member(host)
        slot = self.budget.take(host, member)
        if slot is None:
            self._noise.every(("over budget", host), LOG_EVERY_S,
                              "closing connections from %s at once: it holds %d of this node's peer-port "
                              "connections (at most %d per address, %d in all)", host, self.budget.held_by(host),
                              self.budget.per_address, self.budget.total)
            writer.transport.abort()
            return
        task = asyncio.current_task()
        self._serving.add(task)
        handed_over = False
        try:
            hello_s = self.handshake_timeout if member else min(self.handshake_timeout, STRANGER_HELLO_S)
            handed_over = await self._route(reader, writer, host, where, slot.release, hello_s)
        except ConnectionClosed:
            log.debug("%s closed its connection", where)
        except HandshakeRejected as exc:
            log.debug("handshake with %s refused: %s", where, exc)  # handshake.note_refusal said why
        except (asyncio.TimeoutError, ProtocolError, OSError) as exc:  # (TimeoutError is an OSError since 3.11)
            what = "nothing sent in time" if isinstance(exc, asyncio.TimeoutError) else str(exc) or type(exc).__name__
            self._noise.every(("closing", host), LOG_EVERY_S, "closing peer connection from %s: %s", where, what)
        except asyncio.CancelledError:
            pass  # stop(): the server is going away
        except Exception:  # a purpose handler's bug: noticed, and it costs this connection only
            self._noise.every(("handler bug", host), LOG_EVERY_S, "serving a peer connection from %s failed",
                              where, exc_info=True)
        finally:
            self._serving.discard(task)
            if not handed_over:
                slot.release()
            writer.close()  # a data link lives on in the lane's duplicate of the socket
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _route(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, where: str,
                     release: Callable[[], None], hello_s: float) -> bool:
        """Serve one connection; True when it was handed to the lane (which then owns its slot)."""
        magic = await asyncio.wait_for(read_magic(reader), hello_s)
        if magic == MAGIC:
            answered = await answer(reader, writer, self.auth, {DATA_PURPOSE, *self._purposes}, self._admit,
                                    self._withdraw, where, hello_s)
            if self.auth.key is not None:
                self.on_proved(answered.peer, host)
            if answered.purpose == DATA_PURPOSE:
                try:
                    conn = take_socket(reader, writer, answered, where, self.max_payload, release)
                except BaseException:
                    self.links.withdraw(answered.peer)
                    raise
                log.debug("peer %s connected from %s", conn.peer, where)
                self.lane.take_over(conn, self.links.arrived(conn))
                return True
            link = StreamFrameLink(answered.peer, reader, writer, self.max_payload, cipher=answered.cipher,
                                   idle_timeout=self.link_idle_timeout)
            await self._purposes[answered.purpose](link)
        elif magic == PROFILE_MAGIC:
            if self.auth.key is not None or self.profile is None:
                self._noise.once(("plain profile", where.rpartition(":")[0]),
                                 "refused a plain profile request from %s: this swarm has a secret, profiles are "
                                 "only told over a proved link", where)
                return False
            await answer_profile_request(reader, writer, self.profile())
        elif magic == b"":
            log.debug("liveness probe from %s", where)
        else:
            raise ProtocolError(f"unknown magic {magic!r}")
        return False

    def _admit(self, peer: str, purpose: str) -> Rejection | None:
        if purpose == DATA_PURPOSE:
            return self.links.admit(peer)
        if peer == self.node_id:
            return Rejection("node", f"{peer} is this node's own id")
        return None

    def _withdraw(self, peer: str, purpose: str) -> None:
        if purpose == DATA_PURPOSE:
            self.links.withdraw(peer)
