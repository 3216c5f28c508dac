"""Build this node's own profile: stable id, fresh instance nonce, measured memory."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import time
from typing import Mapping

from .memory import measure_memory
from .node_id import load_or_mint_node_id, new_instance_nonce
from .profile import NodeProfile


def detect_backend() -> str:
    """Best guess of the compute backend; the engine may pass its own instead."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "metal"
    if shutil.which("nvidia-smi"):
        return "cuda"
    return "cpu"


def build_local_profile(
    *,
    state_dir: str | os.PathLike[str],
    swarm: str = "default",
    name: str | None = None,
    api_port: int = 0,
    peer_port: int = 0,
    backend: str | None = None,
    speed: float = 0.0,
    model_id: str = "",
    model_fingerprint: str = "",
    memory_limit: int | None = None,
    memory: tuple[int, int] | None = None,
    memory_kind: str = "ram",
    extra: Mapping[str, str] | None = None,
) -> NodeProfile:
    """`memory`: (total, available) bytes of the memory the model lives in, with `memory_kind` saying
    which ("gpu", "working_set"); None measures the RAM. --memory-limit caps either."""
    total, available = measure_memory(memory_limit, memory)
    return NodeProfile(
        node_id=load_or_mint_node_id(state_dir),
        name=name or socket.gethostname(),
        swarm=swarm,
        api_port=api_port,
        peer_port=peer_port,
        backend=backend or detect_backend(),
        memory_total=total,
        memory_available=available,
        memory_kind=memory_kind,
        speed=speed,
        model_id=model_id,
        model_fingerprint=model_fingerprint,
        instance=new_instance_nonce(),
        started_at=time.time(),
        extra=dict(extra or {}),
    )
