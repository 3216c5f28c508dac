"""The node daemon: one per machine. Finds peers, holds its share of the layers, serves chat."""

from __future__ import annotations

import asyncio
import logging

import mlx.core as mx
from aiohttp import web
from mlx_lm.utils import load_tokenizer

from discovery import Discovery, build_local_profile
from discovery.node_id import machine_id
from partitioner import ModelSpec

from .api.app import make_app
from .coordination.coordinator import Coordinator
from .coordination.events import EventBus
from .coordination.hop_timing import HopTiming
from .coordination.pending_tokens import PendingTokens
from .coordination.router import Router
from .coordination.run_ahead import RunAhead
from .coordination.stage_host import StageHost
from .coordination.stage_service import StageService
from .engine.blas import blas_in_use
from .engine.model_bytes import ModelBytes, measure_model_bytes
from .engine.shard import check_splittable
from .engine.speed_probe import cached_speed, measure_speed
from .engine.worker import MlxWorker
from .inference.service import InferenceService
from .inference.stats import RequestStats
from .models.resolve import LocalModel, resolve_model
from .node_config import NodeConfig
from .peer_stats import PeerStats
from .topology import topology_snapshot
from .transport.lane import DataLane
from .transport.tcp import TcpTransport

log = logging.getLogger(__name__)


def backend_name() -> str:
    return "metal" if mx.metal.is_available() else "cpu"


def weights_dtype(choice: str, backend: str):
    if choice == "auto":
        # float16/bfloat16 matmuls on the CPU backend are several times slower than float32
        return mx.float32 if backend == "cpu" else None
    return None if choice == "native" else getattr(mx, choice)


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
        self.worker = MlxWorker()
        self.events = EventBus()
        self.stats = RequestStats(lambda kind, data: self.events.emit(kind, {**data, "entry": self.node_id}))
        self.hop_timing = HopTiming()  # decode steps this node was the entry of
        self.model: LocalModel | None = None
        self.tokenizer = None
        self.service: InferenceService | None = None
        self._runner: web.AppRunner | None = None
        self._started: list = []  # what to stop, in reverse

    @property
    def model_id(self) -> str:
        return self.model.model_id if self.model else "unknown"

    @property
    def node_id(self) -> str:
        return self.discovery.node_id

    def prepare_model(self) -> None:
        """Resolve and check the model before serving; raises ModelError with one clear line."""
        self.model = resolve_model(self.config.model, self.config.cache_dir, self.backend)
        check_splittable(self.model.path)
        self.tokenizer = load_tokenizer(self.model.path, eos_token_ids=self.model.config.get("eos_token_id"))

    async def start(self) -> None:
        cfg, model = self.config, self.model
        sizes = await self.worker.run(measure_model_bytes, model.path, self.dtype, self.dequantize)
        key = f"{machine_id()}:{model.fingerprint}:{self.dtype}:{self.dequantize}:{self.backend}:{blas_in_use()}"
        speed = cfg.speed or await self.worker.run(
            cached_speed, cfg.state_dir, key,
            lambda: measure_speed(model.path, model.n_layers, self.dtype, self.dequantize))
        profile = build_local_profile(
            state_dir=cfg.state_dir, swarm=cfg.swarm, name=cfg.name, api_port=cfg.api_port,
            peer_port=cfg.peer_port, backend=self.backend, speed=speed, model_id=model.model_id,
            model_fingerprint=model.fingerprint, memory_limit=cfg.memory_limit, extra={"state": "joining"})
        if cfg.node_id:
            profile = profile.replace(node_id=cfg.node_id)

        self.pending = PendingTokens()
        self.lane = DataLane(profile.node_id, cfg.swarm, self.worker.watch,
                             lambda sender, frame: self.stage_service.on_lane_frame(sender, frame),
                             lambda node_id: self.discovery.endpoint_of(node_id))
        self.transport = TcpTransport(profile.node_id, cfg.swarm, cfg.peer_host, cfg.peer_port,
                                      profile_provider=lambda: self.discovery.profile, adopt=self._adopt)
        self.router = Router(profile.node_id, self.transport, self._address_of)
        self.host = StageHost(model.path, self.dtype, self.worker, dequantize=self.dequantize)
        self.run_ahead = RunAhead(profile.node_id)
        self.stage_service = StageService(self.host, self.router, self.pending, self.worker, self.lane,
                                          self.run_ahead, max_batch=cfg.batch_decode)
        self.discovery = Discovery(profile, interfaces=cfg.interfaces, static_peers=cfg.peers, mdns=cfg.mdns,
                                   on_event=self._on_peer_event, state_dir=cfg.state_dir)
        self.coordinator = Coordinator(model_spec(sizes, cfg.kv_reserve_tokens), model.fingerprint,
                                       self.discovery, self.host, self.router, self.pending, self.events,
                                       strategy=cfg.strategy, token_timeout=cfg.token_timeout,
                                       recovery_timeout=cfg.recovery_timeout, timing=self.hop_timing,
                                       run_ahead=self.run_ahead)
        self.peer_stats = PeerStats(self.discovery)
        self.service = InferenceService(self.tokenizer, model.context_length, self.coordinator.pipeline,
                                        self.stats, cfg.default_max_tokens, cfg.recovery_timeout)

        await self.transport.start(self.stage_service.on_message)
        self._started.append(self.transport.stop)
        self.stage_service.start()
        self._started.append(self.stage_service.stop)
        self._runner = web.AppRunner(make_app(self), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, cfg.api_host, cfg.api_port).start()
        self._started.append(self._runner.cleanup)
        await self.discovery.start()
        self._started.append(self.discovery.stop)
        self.peer_stats.start()
        self._started.append(self.peer_stats.stop)
        log.info("node %s (%s): API on %s:%d, peers on %s:%d, %.2f ms/layer/token, swarm %r",
                 self.node_id, profile.name, cfg.api_host, cfg.api_port, cfg.peer_host, cfg.peer_port,
                 speed * 1e3, cfg.swarm)
        await self.coordinator.start()

    def _adopt(self, sock, sender: str, where: str, pending: bytes) -> None:
        """A peer's frame connection, handshaken: from now on the MLX thread reads it."""
        self.worker.post(self.lane.adopt, sock, sender, where, pending)

    def _address_of(self, node_id: str) -> tuple[str, int] | None:
        for peer in self.discovery.view():
            if peer.node_id == node_id:
                return peer.endpoint
        return None

    async def _on_peer_event(self, event) -> None:
        if event.kind == "leave":
            await self.transport.drop(event.node_id)
            self.stage_service.drop_peer(event.node_id)
        await self.coordinator.on_peer_event(event)

    def can_serve(self) -> tuple[bool, str]:
        if self.service is None:
            return False, "starting"
        return self.coordinator.status()

    def health(self) -> dict:
        ok, reason = self.can_serve()
        stage = getattr(getattr(self, "host", None), "stage", None)
        return {"status": "ok" if ok else reason, "node_id": self.node_id if self.service else None,
                "model": self.model_id, "backend": self.backend, "blas": blas_in_use(),
                "plan_id": self.coordinator.plan.plan_id if self.service and self.coordinator.plan else None,
                "layers": [stage.range.start, stage.range.end] if stage else None,
                "weights": stage.shard.weights_run_as if stage else None,
                "cached_requests": stage.active_requests if stage else 0, **self.stats.to_dict(),
                "decode_timing": self.hop_timing.to_dict(), "decode_batching": self._batching()}

    def _batching(self) -> dict:
        service = getattr(self, "stage_service", None)
        if service is None:
            return {}
        return {"max_batch": service.max_batch, "batched_passes": service.batched_passes,
                "batched_rows": service.batched_rows}

    def topology(self) -> dict:
        return topology_snapshot(self)

    async def stop(self) -> None:
        for stop in reversed(self._started):
            try:
                await stop()
            except Exception:
                log.exception("error while stopping")
        self.worker.close()
