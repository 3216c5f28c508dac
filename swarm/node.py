"""The node daemon: one per machine. Loads its part of the model and serves chat."""

from __future__ import annotations

import asyncio
import logging
import socket

import mlx.core as mx
from aiohttp import web
from mlx_lm.utils import load_tokenizer

from discovery.node_id import load_or_mint_node_id

from .api.app import make_app
from .engine.shard import load_shard
from .engine.stage import Stage
from .engine.worker import MlxWorker
from .inference.pipeline import LocalPipeline
from .inference.service import InferenceService
from .inference.stats import RequestStats
from .models.resolve import LocalModel, resolve_model
from .node_config import NodeConfig

log = logging.getLogger(__name__)


def backend_name() -> str:
    return "metal" if mx.metal.is_available() else "cpu"


def weights_dtype(choice: str, backend: str):
    if choice == "auto":
        # float16/bfloat16 matmuls on the CPU backend are several times slower than float32
        return mx.float32 if backend == "cpu" else None
    return None if choice == "native" else getattr(mx, choice)


class Node:
    def __init__(self, config: NodeConfig):
        self.config = config
        self.backend = backend_name()
        self.node_id = config.node_id or load_or_mint_node_id(config.state_dir)
        self.name = config.name or socket.gethostname()
        self.worker = MlxWorker()
        self.stats = RequestStats()
        self.model: LocalModel | None = None
        self.tokenizer = None
        self.stage: Stage | None = None
        self.service: InferenceService | None = None
        self.status_reason = "starting"
        self._runner: web.AppRunner | None = None

    @property
    def model_id(self) -> str:
        return self.model.model_id if self.model else "unknown"

    def prepare_model(self) -> None:
        """Resolve and check the model before serving; raises ModelError with one clear line."""
        self.model = resolve_model(self.config.model, self.config.cache_dir, self.backend)
        self.tokenizer = load_tokenizer(self.model.path, eos_token_ids=self.model.config.get("eos_token_id"))

    async def start(self) -> None:
        if self.model is None:
            await asyncio.to_thread(self.prepare_model)
        self._runner = web.AppRunner(make_app(self), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.config.api_host, self.config.api_port).start()
        log.info("node %s (%s) serving the API on %s:%d", self.node_id, self.name,
                 self.config.api_host, self.config.api_port)
        await self._load_all_layers()

    async def _load_all_layers(self) -> None:
        self.status_reason = "loading model"
        dtype = weights_dtype(self.config.dtype, self.backend)
        shard = await self.worker.run(load_shard, self.model.path, 0, self.model.n_layers, dtype)
        self.stage = Stage(shard)
        pipeline = LocalPipeline([self.stage], self.worker)

        async def get_pipeline():
            return pipeline

        self.service = InferenceService(self.tokenizer, self.model.context_length, get_pipeline,
                                        self.stats, self.config.default_max_tokens)
        self.status_reason = "ready"
        log.info("ready: %s, layers [0, %d), %.1f MB of weights", self.model_id, self.model.n_layers,
                 shard.weight_bytes() / 1e6)

    def health(self) -> dict:
        return {"status": "ok" if self.service else self.status_reason, "node_id": self.node_id,
                "name": self.name, "model": self.model_id, "backend": self.backend,
                "cached_requests": self.stage.active_requests if self.stage else 0,
                **self.stats.to_dict()}

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
        self.worker.close()
