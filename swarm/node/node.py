"""The node daemon: one per machine. Finds peers, holds its share of the layers, serves chat.

Everything is assembled in `Node.start`, top to bottom, each part from the parts
above it; then started in the same order and stopped in reverse. Every part takes the
node's id once, at start; so when the id turns out to be another node's too (a cloned
VM, a copied state dir), the node does not patch it into each part: it re-mints its id
and starts over, all parts afresh (`Node.run`; see `_on_duplicate_id`). Two threads:
the event loop (HTTP API, discovery, the peer-port listener, the entry's generation
loop, planning) and the MLX thread (engine/worker.py: every MLX call, and every peer
frame, read and written by the data lane). README.md, "Architecture", follows one
request through them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import mlx.core as mx
from aiohttp import web
from mlx_lm.utils import load_tokenizer

from discovery import Discovery, build_local_profile
from discovery.node_id import machine_id, remint_node_id
from discovery.profile import NodeProfile
from discovery.view import PeerEvent
from partitioner import ModelSpec

from ..api.admission import Admission
from ..api.app import make_app
from ..api.auth import ApiAccess
from ..api.connection_cap import CappedAppRunner
from ..api.request_gate import RequestGate
from ..engine.blas import blas_in_use
from ..engine.constraints import GrammarVocab
from ..engine.model_bytes import ModelBytes, measure_model_bytes
from ..engine.shard import check_splittable
from ..engine.speed_probe import cached_speed, measure_speed
from ..engine.worker import MlxWorker
from ..entry.entry_inbox import EntryInbox
from ..entry.hop_timing import HopTiming
from ..entry.own_requests import OwnRequests
from ..entry.pending_tokens import PendingTokens
from ..entry.run_ahead import RunAhead
from ..entry.service import InferenceService
from ..entry.stats import RequestStats
from ..entry.swarm_pipeline import SwarmPipelines
from ..api.bootstrap_app import make_bootstrap_app
from ..models.generation_defaults import generation_defaults
from ..models.resolve import LocalModel, describe_model, is_local_spec, models_root, resolve_model
from . import peer_security
from .config import NodeConfig
from .ports import port_error
from .inbox import NodeInbox
from .secrets import API_KEY_FROM_SECRET, Secret, api_key, effective_api_key, swarm_secret
from .sender_rules import SenderRules
from ..planning.coordinator import Coordinator
from ..stage.stage_host import StageHost
from ..stage.stage_service import StageService
from ..events import EventBus
from ..status.node_status import NodeStatus
from ..status.peer_stats import PeerStats
from ..transport.lane import DataLane
from ..transport.link_crypto import stretch_secret
from ..transport.link_handshake import LinkAuth
from ..transport.links import PeerLinks
from ..transport.listener import PeerListener
from ..transport.log_limit import limit_loop_exceptions
from ..transport.peer_profiles import ProfileFetcher
from ..transport.handshake import dial_stream
from ..weights.model_from_peers import model_files_from_peers
from ..weights.peer_weights import PeerWeights
from ..weights.store import ChunkStore
from ..weights.transfer import WEIGHTS_MAX_PAYLOAD, WEIGHTS_PURPOSE

log = logging.getLogger(__name__)

# A node re-mints its id at most once in this long: a second conflict so soon is not a cloned
# machine but someone reusing ids on purpose (in an open swarm anyone can), and a node that
# re-minted at every fake record would flap for as long as the faker cares to.
REMINT_AT_MOST_EVERY_S = 600.0
STOP_PART_TIMEOUT_S = 10.0


class DuplicateNodeId(Exception):
    """The id given by --node-id is another node's too: the node cannot run with it."""


def backend_name() -> str:
    return "metal" if mx.metal.is_available() else "cpu"


def weights_dtype(choice: str, backend: str):
    if choice == "auto":
        # float16/bfloat16 matmuls on the CPU backend are several times slower than float32
        return mx.float32 if backend == "cpu" else None
    return None if choice == "native" else getattr(mx, choice)


def vocab_size(config: dict) -> int | None:
    """The logits' width: every token id a last stage may send back is below it."""
    for source in (config, config.get("text_config") or {}):
        if isinstance(source.get("vocab_size"), int):
            return source["vocab_size"]
    return None


def model_spec(b: ModelBytes, context_tokens: int) -> ModelSpec:
    """Each layer's own weights and cache reserve (sliding windows, recurrent states) for the context."""
    return ModelSpec(n_layers=len(b.per_layer), bytes_per_layer=max(b.per_layer), embedding_bytes=b.embedding,
                     head_bytes=b.head, kv_bytes_per_token_per_layer=b.kv_per_token_per_layer,
                     context_tokens=context_tokens, layer_weight_bytes=b.per_layer,
                     layer_kv_bytes=b.kv_reserve(context_tokens))


class Node:
    def __init__(self, config: NodeConfig):
        self.config = config
        self.backend = backend_name()
        self.dtype = weights_dtype(config.dtype, self.backend)
        # Quantized weights stay packed unless asked: on a CPU backend dequantizing makes prefill ~7-15x
        # faster but a 4-bit layer 7x bigger (benchmarks/cpu_quantized.py), and memory is what a swarm pools.
        self.dequantize = config.dequantize
        self.api_key = api_key(config.api_key, config.state_dir)  # ValueError: an empty key file
        self.worker: MlxWorker | None = None  # the MLX thread of one run, from its first measurement to its last frame
        # The API's door: closed on Ctrl-C while taken requests finish. One for every run (a restart under
        # a new id must not reopen a door the user closed).
        self.gate = RequestGate()
        self.serving = asyncio.Event()  # set while a run has started every part (lifecycle.py waits on it)
        self._stops: list = []  # what to stop, in reverse order of starting
        self._start_over = asyncio.Event()  # set when this run's id turned out to be another node's
        self._fatal: str | None = None
        self._reminted_at: float | None = None
        self._from_peers = False  # the model's files were fetched from peers (kept across a start over)

    def prepare_secret(self) -> None:
        """Find the swarm secret (flag, environment, state dir); ValueError for an unusable one."""
        self.secret: Secret = swarm_secret(self.config.secret, self.config.state_dir)

    def prepare_model(self) -> None:
        """Resolve and check the model before serving; raises ModelError with one clear line.

        A model this machine does not hold (`--model ID` naming no local path or cached repo, or
        `--join`) is learned from the peers that serve it once the node runs: `model` stays None."""
        spec = self.config.model
        if self.config.join or (spec is not None and not is_local_spec(spec)):
            self.model, self.tokenizer = None, None
            return
        self.model = resolve_model(spec, self.config.cache_dir, self.backend)
        self._check_model()

    def _check_model(self) -> None:
        check_splittable(self.model.path)
        self.tokenizer = load_tokenizer(self.model.path, eos_token_ids=self.model.config.get("eos_token_id"))
        log.info("model %s: %d layers, from %s", self.model.model_id, self.model.n_layers, self.model.path)

    async def _measure(self, model: LocalModel) -> tuple[ModelBytes, float]:
        """The model's sizes as this node loads it, and this node's speed on two of its layers (cached).
        A node that fetches its model measures before it holds those layers: it reads zeros in their
        place, which compute at the same speed."""
        cfg, worker = self.config, self.worker
        sizes = await worker.run(measure_model_bytes, model.path, self.dtype, self.dequantize)
        key = f"{machine_id()}:{model.fingerprint}:{self.dtype}:{self.dequantize}:{self.backend}:{blas_in_use()}"
        speed = cfg.speed or await worker.run(
            cached_speed, cfg.state_dir, key,
            lambda: measure_speed(model.path, model.n_layers, self.dtype, self.dequantize))
        return sizes, speed

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; start over under a new id when ours is another node's.

        `stop` set while a start is under way stops the start (what it started is stopped).
        Raises what a start raised (e.g. ports.PortError), or DuplicateNodeId when the id
        came from --node-id (which a new id cannot change)."""
        while True:
            self._start_over = asyncio.Event()
            stopping = asyncio.ensure_future(stop.wait())
            restarting = asyncio.ensure_future(self._start_over.wait())
            # Starting may wait long (a node that fetches its model waits for a peer that holds it):
            # a stop then ends it too.
            starting = asyncio.ensure_future(self.start())
            try:
                await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if starting.done():
                    starting.result()  # a start that failed raises here
                    self.serving.set()
                    await asyncio.wait({stopping, restarting}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.serving.clear()
                stopping.cancel()
                restarting.cancel()
                if not starting.done():  # a start stopped halfway: the stop below stops what it started
                    starting.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await starting
                await self.stop()
            if self._fatal:
                raise DuplicateNodeId(self._fatal)
            if stop.is_set():
                return
            log.warning("starting over with the new node id")

    def _on_duplicate_id(self, own: NodeProfile, other: NodeProfile, addresses: tuple[str, ...]) -> None:
        """Another node (earlier started) uses our id (discovery tells us; we are the one to move)."""
        where = f"{addresses[0]}:{other.peer_port}" if addresses else "?"
        if self.config.node_id:
            self._fatal = (f"node id {own.node_id!r} (from --node-id) is also the id of another node at {where}, "
                           f"which started earlier; start this one with another --node-id, or none")
            self._start_over.set()
            return
        now = time.monotonic()
        if self._reminted_at is not None and now - self._reminted_at < REMINT_AT_MOST_EVERY_S:
            log.warning("node %s at %s claims our id %s too, %.0f s after we took it: not re-minting again within "
                        "%.0f s (in a swarm without a secret anyone can claim any id)", other.name, where,
                        own.node_id, now - self._reminted_at, REMINT_AT_MOST_EVERY_S)
            return
        self._reminted_at = now
        new_id = remint_node_id(self.config.state_dir)
        log.warning("node id %s is also the id of node %s at %s, which started earlier: this node takes the "
                    "new id %s and starts over", own.node_id, other.name, where, new_id)
        self._start_over.set()

    async def start(self) -> None:
        self.worker = MlxWorker()
        self._stops = []
        cfg, model, worker = self.config, self.model, self.worker
        loop = asyncio.get_running_loop()
        limit_loop_exceptions(loop)  # e.g. accept() out of descriptors: not a traceback per connection
        if not hasattr(self, "secret"):
            self.prepare_secret()
        peer_security.log_at_start(self.secret)
        # Stretched once (scrypt, slow on purpose), off the loop.
        link_key = await asyncio.to_thread(stretch_secret, self.secret.value) if self.secret else None
        key = effective_api_key(self.api_key, link_key)  # a closed swarm's API is closed too
        self._api_access = ApiAccess(key.value, local_without_key=key.source == API_KEY_FROM_SECRET)

        # What this node is: its model's sizes, its speed, its profile (and so its id). A node that
        # fetches its model names only the model it looks for until it has the model's small files.
        if model is not None:
            log.info("measuring the model's layers%s",
                     "" if cfg.speed else " and this machine's speed (cached after once)")
        sizes, speed = await self._measure(model) if model is not None else (None, 0.0)
        profile = build_local_profile(
            state_dir=cfg.state_dir, swarm=cfg.swarm, name=cfg.name, api_port=cfg.api_port,
            peer_port=cfg.peer_port, backend=self.backend, speed=speed,
            model_id=model.model_id if model else (cfg.model or ""),
            model_fingerprint=model.fingerprint if model else "", memory_limit=cfg.memory_limit,
            extra={"state": "joining" if model else "looking"})
        if cfg.node_id:
            profile = profile.replace(node_id=cfg.node_id)
        node_id = profile.node_id

        # Who else is there. Peer events wait in a queue until planning consumes them (below). Profiles
        # and probes go over the peer protocol: with a secret, only peers that prove it enter the view,
        # and an mDNS record only names an endpoint to ask.
        auth = LinkAuth(node_id, cfg.swarm, link_key)
        peer_events: asyncio.Queue[PeerEvent] = asyncio.Queue()
        discovery = Discovery(profile, interfaces=cfg.interfaces, static_peers=cfg.peers, mdns=cfg.mdns,
                              on_event=peer_events, state_dir=cfg.state_dir, on_duplicate=self._on_duplicate_id,
                              fetch_profile=ProfileFetcher(auth), mdns_is_hint=link_key is not None)

        # The peer data path: one connection per peer, read and written on the MLX thread; every message
        # goes to the node's inbox (below), and so does a link that breaks.
        links = PeerLinks(node_id)
        lane = DataLane(node_id, cfg.swarm, links, worker.watch, worker.post, discovery.endpoint_of, key=link_key)
        listener = PeerListener(node_id, cfg.swarm, cfg.peer_host, cfg.peer_port, links, lane,
                                lambda: discovery.profile, key=link_key, is_member=discovery.is_peer_address)

        # Weights: served to peers from what this node holds; fetched from them for layers it lacks, over
        # links for that purpose (authenticated and sealed like the data path's when the swarm has a secret).
        weights = PeerWeights(worker, lambda peer: dial_stream(discovery.endpoint_of(peer), auth, WEIGHTS_PURPOSE,
                                                               expected_peer=peer, max_payload=WEIGHTS_MAX_PAYLOAD),
                              lambda: _holders(discovery, weights),
                              lambda st: discovery.update_profile(fetch=st.profile_field()))
        listener.serve_purpose(WEIGHTS_PURPOSE, weights.serve)
        if model is not None and not self._from_peers:
            weights.store = ChunkStore.complete(model.path, model.manifest)
        elif model is not None:  # fetched before this start (the node starts over under a new id)
            weights.store = ChunkStore.partial(model.path, model.manifest)
        else:
            await self._start(lambda: _bound("peer", cfg.peer_host, cfg.peer_port, listener.start), listener.stop)
            await self._start(discovery.start, discovery.stop)
            model, sizes, speed = await self._model_from_peers(discovery, weights)
            await discovery.update_profile(model_id=model.model_id, model_fingerprint=model.fingerprint,
                                           speed=speed, state="joining")

        # The stage: the layers this node holds, and the frames for them queued, batched and computed.
        vocab = GrammarVocab(self.tokenizer)  # grammars: checked by the entry, applied by the last stage
        host = StageHost(model.path, self.dtype, worker, dequantize=self.dequantize, context=model.context_length,
                         layer_caches=sizes.caches, vocab=vocab)
        stage_service = StageService(host, lane, worker, max_batch=cfg.batch_decode,
                                     prompt_gather_s=cfg.prompt_gather_ms / 1000)

        # Planning: the plan from the view, our layers loaded, agreement.
        events = EventBus()
        coordinator = Coordinator(node_id, model_spec(sizes, cfg.kv_reserve_tokens), model.fingerprint, discovery,
                                  host, events, strategy=cfg.strategy, recovery_timeout=cfg.recovery_timeout,
                                  weights=weights)

        # The entry: its requests' pending tokens (broken when planning says a plan lost a stage), the
        # run-ahead, and its inbox for the tokens and errors that come back.
        pending, run_ahead, hop_timing, own = PendingTokens(), RunAhead(node_id), HopTiming(), OwnRequests()
        coordinator.on_plans_broken.append(pending.break_all)
        entry_inbox = EntryInbox(node_id, worker, pending, run_ahead, loop,
                                 stage_service.mlx_send_or_fail, lane.mlx_send, lane.mlx_sending_together,
                                 current_plan=lambda: coordinator.plan)

        # The node's inbox: every peer message, checked first against who may send it (sender_rules.py),
        # to the stage or to the entry.
        rules = SenderRules(node_id, host.known_plan, lambda peer: discovery.endpoint_of(peer) is not None, own,
                            vocab_size(model.config))
        inbox = NodeInbox(lane, worker, rules, stage_service, entry_inbox)

        # The entry side: requests through pipelines on agreed plans.
        stats = RequestStats(events.emit, entry=node_id)
        pipelines = SwarmPipelines(coordinator.agreed_plan, node_id, entry_inbox, pending, cfg.token_timeout,
                                   hop_timing, run_ahead, own)
        service = InferenceService(self.tokenizer, model.context_length, pipelines, stats, cfg.default_max_tokens,
                                   cfg.recovery_timeout, vocab)
        defaults = generation_defaults(model.path, cfg.temperature, cfg.top_p, cfg.top_k)
        log.info("requests that leave sampling out get %s", defaults.describe())

        # What the node tells: /health, /v1/topology, and the HTTP API over it all.
        peer_stats = PeerStats(discovery)
        status = NodeStatus(model, self.backend, discovery, coordinator, host, stage_service, links, stats,
                            hop_timing, peer_stats, weights, api_key=bool(key),
                            peers=peer_security.describe(self.secret))
        admission = Admission(cfg.max_active, cfg.max_queue)
        app = make_app(service, status, events, model.model_id, admission, defaults, self.gate, api_key=self._api_access,
                       body_timeout=cfg.http_timeout)
        # keepalive_timeout closes a connection idle between requests, and one that never completes
        # its headers (aiohttp's default keeps both for an hour). handler_cancellation: a client that
        # goes away cancels its handler, streaming or not, and leaving the handler frees the request on
        # every stage. Taken requests are drained before a stop (lifecycle.py), so a stop waits
        # for nothing long; a restart under a new id cuts off what it finds within shutdown_timeout.
        runner = CappedAppRunner(app, per_address=cfg.http_connections_per_address, access_log=None,
                                 keepalive_timeout=cfg.http_timeout, handler_cancellation=True,
                                 shutdown_timeout=1.0)

        # Start, in the same order.
        inbox.start()
        self._stops.append(inbox.stop)
        if not self._started(listener.stop):
            await self._start(lambda: _bound("peer", cfg.peer_host, cfg.peer_port, listener.start), listener.stop)
        await runner.setup()
        self._stops.append(runner.cleanup)
        await _bound("api", cfg.api_host, cfg.api_port, web.TCPSite(runner, cfg.api_host, cfg.api_port).start)
        if not self._started(discovery.stop):
            await self._start(discovery.start, discovery.stop)
        peer_stats.start()
        self._stops.append(peer_stats.stop)
        log.info("node %s (%s): API on %s:%d, peers on %s:%d, %.2f ms/layer/token, swarm %r (%s)",
                 node_id, profile.name, cfg.api_host, cfg.api_port, cfg.peer_host, listener.port, speed * 1e3,
                 cfg.swarm, "with a secret" if link_key else "OPEN: no secret")
        if key.source == API_KEY_FROM_SECRET:
            log.info("the API requires a key derived from the swarm secret for everything but /health, except "
                     "from this machine (`swarm-node --print-api-key` prints it for clients elsewhere)")
        elif key:
            log.info("the API requires its key (from %s) for everything but /health", key.source)
        else:
            log.warning("the API takes requests from anyone who can reach %s:%d (no API key: see --api-key)",
                        cfg.api_host, cfg.api_port)
        await coordinator.start()
        self._stops.append(coordinator.stop)
        consumer = asyncio.create_task(_consume_peer_events(peer_events, inbox, coordinator),
                                       name="peer-events")
        self._stops.append(lambda: _cancel(consumer))
        host = cfg.api_host if cfg.api_host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        url = f"http://{host}:{runner.addresses[0][1]}/v1"
        ready = asyncio.create_task(_say_ready(coordinator, url), name="say-ready")
        self._stops.append(lambda: _cancel(ready))

    async def _start(self, start, stop) -> None:
        await start()
        self._stops.append(stop)

    def _started(self, stop) -> bool:
        return stop in self._stops

    async def _model_from_peers(self, discovery: Discovery, weights: PeerWeights
                                ) -> tuple[LocalModel, ModelBytes, float]:
        """Learn the model from the peers that serve it; meanwhile /health says what we wait for."""
        cfg = self.config
        waiting = {"status": "starting"}

        async def report(line: str, state: str) -> None:
            waiting["status"] = line
            await discovery.update_profile(state=state)

        runner = web.AppRunner(make_bootstrap_app(lambda: {**waiting, "fetch": weights.status.to_dict()},
                                                  discovery, cfg.model, self._api_access), access_log=None)
        await runner.setup()
        try:
            await _bound("api", cfg.api_host, cfg.api_port, web.TCPSite(runner, cfg.api_host, cfg.api_port).start)
            root = models_root(cfg.cache_dir)
            model_id, manifest = await model_files_from_peers(None if cfg.join else cfg.model, discovery,
                                                              weights.open_link, root, weights, report)
            self.model = describe_model(weights.store.root, model_id, root, manifest)
            self._from_peers = True
            self._check_model()
            sizes, speed = await self._measure(self.model)
        finally:
            await runner.cleanup()
        return self.model, sizes, speed

    async def stop(self) -> None:
        for stop in reversed(self._stops):
            try:
                # Bounded: a part that hangs must not keep the node from starting over (or exiting).
                await asyncio.wait_for(stop(), STOP_PART_TIMEOUT_S)
            except asyncio.TimeoutError:
                log.error("%s did not stop within %.0f s", getattr(stop, "__qualname__", stop), STOP_PART_TIMEOUT_S)
            except Exception:
                log.exception("error while stopping")
        self._stops = []
        if self.worker is not None:
            self.worker.close()


def _holders(discovery: Discovery, weights: PeerWeights) -> list[str]:
    """Peers that serve the model this node holds or fetches: they hold some or all of its chunks."""
    if weights.store is None:
        return []
    fingerprint = weights.store.manifest.fingerprint
    return [p.node_id for p in discovery.view() if p.profile.model_fingerprint == fingerprint]


async def _consume_peer_events(events: asyncio.Queue[PeerEvent], inbox: NodeInbox,
                               coordinator: Coordinator) -> None:
    while True:
        event = await events.get()
        try:
            if event.kind == "leave":
                inbox.drop_peer(event.node_id)
            await coordinator.on_peer_event(event)
        except Exception:
            log.exception("handling %s of %s failed", event.kind, event.node_id)


async def _say_ready(coordinator: Coordinator, url: str) -> None:
    """One line once the first whole pipeline serves: where to send requests."""
    while True:
        try:
            await coordinator.agreed_plan()
        except NoPipeline:
            continue  # the coordinator logs why (e.g. the swarm cannot hold the model)
        log.info("ready: %s", url)
        return


async def _bound(kind: str, host: str, port: int, listen) -> None:
    """Listen (`listen()`); a port taken since cli's check_port is the same one line naming the flag."""
    try:
        await listen()
    except OSError as e:
        raise port_error(kind, host, port, e) from None


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
