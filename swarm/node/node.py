"""The node daemon: one per machine. Finds peers, holds its share of the layers, serves chat.

Every part is built in `Node.start` (assembly.py), each from the parts before it; then
started in the same order and stopped in reverse. Every part takes the
node's id once, at start; so when the id turns out to be another node's too (a cloned
VM, a copied state dir), the node does not patch it into each part: it re-mints its id
and starts over, all parts afresh (`Node.run`; see `_on_duplicate_id`). Two threads:
the event loop (HTTP API, discovery, the peer-port listener, the entry's generation
loop, planning) and the MLX thread (engine/worker.py: every MLX call, and every peer
frame, read and written by the data lane). docs/architecture.md follows one request
through them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import mlx.core as mx
from aiohttp import web
from mlx_lm.utils import load_tokenizer

from discovery import Discovery, NodeState, build_local_profile
from discovery.memory import measure_memory
from discovery.node_id import machine_id, remint_node_id
from discovery.profile import NodeProfile
from discovery.profile_keys import STATE_KEY
from discovery.view import PeerEvent
from partitioner import ModelSpec

from ..api.bootstrap_app import make_bootstrap_app
from ..api.web_guard import WebGuard
from ..api.request_gate import RequestGate
from ..backend import describe_memory, this_backend
from ..engine.blas import blas_in_use
from ..engine.model_bytes import ModelBytes, measure_model_bytes
from ..engine.model_outline import Outline
from ..engine.shard import check_splittable
from ..engine.speed_probe import cached_speed, measure_speed
from ..engine.worker import MlxWorker
from ..entry.draft_model import DraftModel, check_draft_model
from ..entry.speculation import speculation_mode
from ..models.generation_defaults import generation_defaults
from ..models.resolve import (LocalModel, describe_model, is_local_spec, models_root, resolve_model,
                              where_not_found)
from ..planning.coordinator import Coordinator
from ..planning.errors import NoPipeline
from ..tasks import cancel_and_wait
from ..transport.link_crypto import stretch_secret
from ..transport.log_limit import limit_loop_exceptions
from ..weights.model_from_peers import model_files_from_peers
from ..weights.peer_weights import PeerWeights
from ..weights.store import ChunkStore
from . import peer_security
from .assembly import PeerSide, api_access, build_peer_side, build_serving
from .config import NodeConfig
from .inbox import NodeInbox
from .ports import port_error, reachable_urls
from .secrets import API_KEY_FROM_SECRET, Secret, api_key, effective_api_key, swarm_secret

log = logging.getLogger(__name__)

# A node re-mints its id at most once in this long: a second conflict so soon is not a cloned
# machine but someone reusing ids on purpose (in an open swarm anyone can), and a node that
# re-minted at every fake record would flap for as long as the faker cares to.
REMINT_AT_MOST_EVERY_S = 600.0
STOP_PART_TIMEOUT_S = 10.0


class DuplicateNodeId(Exception):
    """The id given by --node-id is another node's too: the node cannot run with it."""


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
                     layer_kv_bytes=b.kv_reserve(context_tokens), activation_bytes=b.activation)


class Node:
    def __init__(self, config: NodeConfig):
        self.config = config
        self.backend = this_backend()
        self.dtype = self.backend.weights_dtype(config.dtype)
        # Quantized weights stay packed unless asked: on a CPU backend dequantizing makes prefill ~7-15x
        # faster but a 4-bit layer 7x bigger (benchmarks/cpu_quantized.py), and memory is what a swarm pools.
        self.dequantize = config.dequantize
        self.api_key = api_key(config.api_key, config.state_dir)  # ValueError: an empty key file
        self.worker: MlxWorker | None = None  # the MLX thread of one run, from its first measurement to its last frame
        # The API's door: closed on Ctrl-C while taken requests finish. One for every run (a restart under
        # a new id must not reopen a door the user closed).
        self.gate = RequestGate()
        # Which web pages and Host names the API answers (api/web_guard.py): this machine's names and
        # addresses are read once, for the bootstrap API and the full one alike.
        self.web_guard = WebGuard.for_node(config.api_port, config.allowed_origins, config.allowed_hosts)
        self.serving = asyncio.Event()  # set while a run has started every part (lifecycle.py waits on it)
        self._stops: list = []  # what to stop, in reverse order of starting
        self._start_over = asyncio.Event()  # set when this run's id turned out to be another node's
        self._fatal: str | None = None
        self._reminted_at: float | None = None
        self._from_peers = False  # the model's files were fetched from peers (kept across a start over)
        self.outline: Outline | None = None  # the model's, once it is known and checked
        self.draft_files: LocalModel | None = None  # --draft-model's, once checked against the model

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
        self.model = resolve_model(spec, self.config.cache_dir, self.backend.kind)
        self._check_model()

    def _check_model(self) -> None:
        self.outline = check_splittable(self.model.path)  # the one outline of the model, for all that builds it
        self.tokenizer = load_tokenizer(self.model.path, eos_token_ids=self.model.config.get("eos_token_id"))
        if self.config.draft_model:
            self.draft_files = check_draft_model(self.config.draft_model, self.model, self.tokenizer,
                                                 self.config.cache_dir, self.backend.kind)
        log.info("model %s: %d layers, from %s", self.model.model_id, self.model.n_layers, self.model.path)

    async def _measure(self, model: LocalModel) -> tuple[ModelBytes, float]:
        """The model's sizes as this node loads it, and this node's speed on two of its layers (cached).
        A node that fetches its model measures before it holds those layers: it reads zeros in their
        place, which compute at the same speed."""
        cfg, worker = self.config, self.worker
        sizes = await worker.run(measure_model_bytes, model.path, self.dtype, self.dequantize, self.outline)
        speed_key = f"{machine_id()}:{model.fingerprint}:{self.dtype}:{self.dequantize}:{self.backend.kind}:{blas_in_use()}"
        speed = cfg.speed or await worker.run(
            cached_speed, cfg.state_dir, speed_key,
            lambda: measure_speed(model.path, model.n_layers, self.dtype, self.dequantize, self.outline))
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
        """Build every part (assembly.py) and start it; what was started is in `_stops`."""
        self.worker = MlxWorker(tidy_heap=self.backend.cpu_tuning)
        if self.backend.cpu_tuning:
            # MLX keeps freed buffers by size for reuse, up to the whole memory by default: a burst of passes
            # of many batch widths left hundreds of MB a stage's budget never counted. On the CPU they go
            # back to the allocator at no measured cost; a GPU's allocations are dear, so its cache stays.
            mx.set_cache_limit(0)
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
        self._api_access = api_access(key)

        # What this node is: its model's sizes, its speed, its profile (and so its id). A node that
        # fetches its model names only the model it looks for until it has the model's small files.
        if model is not None:
            log.info("measuring the model's layers%s",
                     "" if cfg.speed else " and this machine's speed (cached for an hour)")
        sizes, speed = await self._measure(model) if model is not None else (None, 0.0)
        speculate, draft = await self._speculation(model, sizes) if model is not None else (None, None)
        profile = build_local_profile(
            state_dir=cfg.state_dir, swarm=cfg.swarm, name=cfg.name, api_port=cfg.api_port,
            peer_port=cfg.peer_port, backend=self.backend.kind, speed=speed,
            memory=self.backend.offered_memory(*measure_memory()), memory_kind=self.backend.memory_kind,
            model_id=model.model_id if model else (cfg.model or ""),
            model_fingerprint=model.fingerprint if model else "", memory_limit=cfg.memory_limit,
            extra={STATE_KEY: (NodeState.JOINING if model else NodeState.LOOKING).value})
        if cfg.node_id:
            profile = profile.replace(node_id=cfg.node_id)
        if cfg.prompt_cache:  # a fixed prompt cache is memory the model's layers cannot have
            profile = profile.replace(memory_available=max(0, profile.memory_available - cfg.prompt_cache))
        if draft is not None:  # nor is the draft model's
            profile = profile.replace(memory_available=max(0, profile.memory_available - draft.weight_bytes))

        store = None if model is None else (ChunkStore.partial if self._from_peers else ChunkStore.complete)(
            model.path, model.manifest)  # partial: fetched before this start (it starts over under a new id)
        peers = build_peer_side(cfg, profile, worker, link_key, self._on_duplicate_id, store)
        # A node without its model joins the network first, to learn the model from its peers.
        joined_first = model is None
        if joined_first:
            await self._start_peer_port(peers)
            await self._start(peers.discovery.start, peers.discovery.stop)
            model, sizes, speed = await self._model_from_peers(peers.discovery, peers.weights)
            await peers.discovery.update_profile(model_id=model.model_id, model_fingerprint=model.fingerprint,
                                                 speed=speed, state=NodeState.JOINING)
            speculate, draft = await self._speculation(model, sizes)  # (its memory is not taken off the offer)

        defaults = generation_defaults(model.path, cfg.temperature, cfg.top_p, cfg.top_k)
        log.info("requests that leave sampling out get %s", defaults.describe())
        serving = build_serving(cfg, peers, worker, model, self.tokenizer, sizes,
                                model_spec(sizes, cfg.kv_reserve_tokens), vocab_size(model.config), self.dtype,
                                self.dequantize, self.outline, self.backend, defaults, self.gate, key,
                                self.secret, loop, self.web_guard, speculate, draft)

        # Start, in the same order: the inbox takes messages before the peer port accepts them, the
        # API answers before discovery announces it.
        serving.inbox.start()
        self._stops.append(serving.inbox.stop)
        if not joined_first:
            await self._start_peer_port(peers)
        runner = serving.runner
        await runner.setup()
        self._stops.append(runner.cleanup)
        await _bound("api", cfg.api_host, cfg.api_port, web.TCPSite(runner, cfg.api_host, cfg.api_port).start)
        if not joined_first:
            await self._start(peers.discovery.start, peers.discovery.stop)
        serving.peer_stats.start()
        self._stops.append(serving.peer_stats.stop)
        log.info("node %s (%s): API on %s:%d, peers on %s:%d, %.2f ms/layer/token, swarm %r (%s); backend %s, "
                 "offering %.1f GiB of %s, weights %s", profile.node_id, profile.name, cfg.api_host, cfg.api_port,
                 cfg.peer_host, peers.listener.port, speed * 1e3, cfg.swarm,
                 "with a secret" if link_key else "OPEN: no secret", self.backend.describe(),
                 profile.memory_available / 2**30, describe_memory(profile.memory_kind),
                 "as stored" if self.dtype is None else str(self.dtype).removeprefix("mlx.core."))
        if key.source == API_KEY_FROM_SECRET:
            log.info("the API requires a key derived from the swarm secret for everything but /health, except "
                     "from this machine (`swarm-node --print-api-key` prints it for clients elsewhere)")
        elif key:
            log.info("the API requires its key (from %s) for everything but /health", key.source)
        else:
            log.warning("the API takes requests from anyone who can reach %s:%d (no API key: see --api-key)",
                        cfg.api_host, cfg.api_port)
        coordinator = serving.coordinator
        await self._start(coordinator.start, coordinator.stop)
        await self._start(serving.link_meter.start, serving.link_meter.stop)
        await self._start(peers.paths.start, peers.paths.stop)
        if serving.speed is not None:
            await self._start(serving.speed.start, serving.speed.stop)
        consumer = asyncio.create_task(_consume_peer_events(peers.peer_events, serving.inbox, coordinator),
                                       name="peer-events")
        self._stops.append(lambda: cancel_and_wait(consumer))
        urls = reachable_urls(cfg.api_host, runner.addresses[0][1])
        ready = asyncio.create_task(_say_ready(coordinator, urls), name="say-ready")
        self._stops.append(lambda: cancel_and_wait(ready))

    async def _speculation(self, model: LocalModel, sizes: ModelBytes) -> tuple[str, DraftModel | None]:
        """What this node's requests draft with (speculation.py), and the draft model, loaded when used."""
        cfg = self.config
        mode = speculation_mode(cfg.speculate, sizes.checks_drafts, self.draft_files is not None)
        if "draft" not in mode:
            if self.draft_files is not None and sizes.checks_drafts:
                log.info("the draft model is not used: --speculate %s", cfg.speculate)
            return mode, None
        return mode, await DraftModel.load(self.draft_files, self.worker, self.dtype, self.dequantize,
                                           vocab_size(model.config))

    async def _start(self, start, stop) -> None:
        await start()
        self._stops.append(stop)

    async def _start_peer_port(self, peers: PeerSide) -> None:
        cfg = self.config
        await self._start(lambda: _bound("peer", cfg.peer_host, cfg.peer_port, peers.listener.start),
                          peers.listener.stop)

    async def _model_from_peers(self, discovery: Discovery, weights: PeerWeights
                                ) -> tuple[LocalModel, ModelBytes, float]:
        """Learn the model from the peers that serve it; meanwhile /health says what we wait for."""
        cfg = self.config
        waiting = {"status": "starting"}

        async def report(line: str, state: NodeState) -> None:
            waiting["status"] = line
            await discovery.update_profile(extra={STATE_KEY: state})

        runner = web.AppRunner(make_bootstrap_app(lambda: {**waiting, "fetch": weights.status.to_dict()},
                                                  discovery, cfg.model, self._api_access, self.web_guard),
                                access_log=None)
        await runner.setup()
        try:
            await _bound("api", cfg.api_host, cfg.api_port, web.TCPSite(runner, cfg.api_host, cfg.api_port).start)
            root = models_root(cfg.cache_dir)
            model_id, manifest = await model_files_from_peers(
                None if cfg.join else cfg.model, discovery, weights.open_link, root, weights, report,
                not_here="" if cfg.join else where_not_found(cfg.model), swarm=cfg.swarm)
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


async def _consume_peer_events(events: asyncio.Queue[PeerEvent], inbox: NodeInbox,
                               coordinator: Coordinator) -> None:
    while True:
        # The events queued now, then one plan for them all: a swarm of 32 sends updates by the dozen a
        # second, and planning once per event made each node plan faster than it could.
        burst = [await events.get()]
        while not events.empty():
            burst.append(events.get_nowait())
        for event in burst:
            try:
                if event.kind == "leave":
                    inbox.drop_peer(event.node_id)
                await coordinator.on_peer_event(event, replan=False)
            except Exception:
                log.exception("handling %s of %s failed", event.kind, event.node_id)
        try:
            await coordinator.settle()
        except Exception:
            log.exception("planning after %d peer events failed", len(burst))


async def _say_ready(coordinator: Coordinator, urls: list[str]) -> None:
    """One line once the first whole pipeline serves: where to send requests (every address, when the
    API listens on all of them)."""
    while True:
        try:
            await coordinator.agreed_plan()
        except NoPipeline:
            continue  # the coordinator logs why (e.g. the swarm cannot hold the model)
        log.info("ready: %s%s", urls[0], f" (also {', '.join(urls[1:])})" if urls[1:] else "")
        return


async def _bound(kind: str, host: str, port: int, listen) -> None:
    """Listen (`listen()`); a port taken since cli's check_port is the same one line naming the flag."""
    try:
        await listen()
    except OSError as e:
        raise port_error(kind, host, port, e) from None
