"""The compute backend a node runs on (Metal, CUDA or the CPU), as MLX itself reports it, and what it decides.

One place says per backend:
- the weights' dtype that `--dtype auto` picks: the model's own on a GPU; float32 on the CPU, where
  float16/bfloat16 matmuls are several times slower;
- the memory the node offers the swarm: the card's memory on CUDA (a box with a 24 GB card and 64 GB of
  RAM holds 24 GB of layers), MLX's recommended working set on Metal (unified memory, but the GPU may
  not wire all of it), the RAM on the CPU; always capped by --memory-limit (discovery applies the cap);
- the activations' dtype on the wire: the weights' (a stage computes in it and sends what it computed;
  a peer of another backend takes any float dtype at its first layer);
- whether a whole-model stage builds the next decode step before reading this one's token (GPUs);
- the prompt chunk an entry sends when `--prefill-chunk` is not given (entry/generate.py): small on the
  CPU, where a chunk's pass is slow and is what a long prompt holds other requests back at a stage; 256
  on a GPU, where a chunk is fast and a bigger pass keeps the device busy; and the larger chunk of a
  prompt that no other request waits behind (64 on a CPU, mlx-lm's 2048 on a GPU);
- whether the CPU-only tuning runs: the optimized-BLAS re-exec (engine/blas.py), prompt rows across CPU
  streams with BLAS thread switching (engine/row_streams.py), the heap tidy when the MLX thread falls idle
  (engine/worker.py), no MLX buffer cache (node/node.py). Each tunes MLX's CPU device; on a GPU they only
  cost.

`SWARM_DEVICE_STANDIN` (a JSON device description with a "kind") makes this process describe its device
as given instead of asking MLX: tests run a stand-in node of another backend with it. The arithmetic
still runs where MLX runs.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass

import mlx.core as mx

from . import environment

KINDS = ("metal", "cuda", "cpu")
STANDIN_ENV = environment.DEVICE_STANDIN.name

# Positions per prompt chunk by default (`prefill_chunk` below; docs/architecture.md has the CPU's figures).
CPU_PREFILL_CHUNK = 16
GPU_PREFILL_CHUNK = 256
# Positions per chunk of a prompt no other request of its entry waits behind (`prefill_chunk_alone` below):
# a request arriving meanwhile waits for the pass under way at each stage for each of its first frames (a
# CPU reads ~100 positions a second of the default model: a short chat 1 s after a 5,500-token prompt
# took 2.6x its quiet time at 128 on 3 netns hosts, the limit is 3x); mlx-lm's own prefill_step_size on
# a GPU.
CPU_PREFILL_CHUNK_ALONE = 64
GPU_PREFILL_CHUNK_ALONE = 2048

# Each backend's memory_kind: which memory a profile's offered bytes are (one of discovery.profile.MEMORY_KINDS).
MEMORY_KIND_OF = {"cuda": "gpu", "metal": "working_set", "cpu": "ram"}
_MEMORY_WORDS = {"gpu": "GPU memory", "working_set": "Metal working set", "ram": "RAM"}


@dataclass(frozen=True)
class Backend:
    kind: str  # "metal" | "cuda" | "cpu"
    device: str  # the device's name, as MLX gives it
    device_total: int | None = None  # bytes of the device's own memory (None: the host's RAM is the memory)
    device_free: int | None = None  # of them, what the device can hold for us now

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"backend {self.kind!r} is not one of {KINDS}")

    @classmethod
    def from_device_info(cls, kind: str, info: Mapping[str, object]) -> Backend:
        """From MLX's device description (`mx.device_info()`): CUDA gives total_memory and free_memory,
        Metal memory_size and max_recommended_working_set_size; the CPU no memory at all."""
        name = str(info.get("device_name") or info.get("architecture") or kind)
        if kind == "cuda":
            total = _int(info.get("total_memory")) or _int(info.get("memory_size"))
            free = _int(info.get("free_memory"))
            return cls(kind, name, total, free if free is not None else total)
        if kind == "metal":
            working_set = _int(info.get("max_recommended_working_set_size"))
            return cls(kind, name, working_set, working_set)
        return cls(kind, name)

    # -- the choices ----------------------------------------------------
    @property
    def is_gpu(self) -> bool:
        return self.kind != "cpu"

    @property
    def cpu_tuning(self) -> bool:
        """Whether the CPU-only tuning runs (the module's docstring lists it)."""
        return self.kind == "cpu"

    def weights_dtype(self, choice: str) -> mx.Dtype | None:
        """The dtype to cast floating weights to for `--dtype choice`; None keeps the model's own."""
        if choice == "auto":
            return mx.float32 if self.kind == "cpu" else None
        return None if choice == "native" else getattr(mx, choice)

    def wire_dtype(self, weights_dtype: mx.Dtype | None, model_dtype: mx.Dtype) -> mx.Dtype:
        """The activations' dtype this node computes and sends: its weights' (see the module docstring)."""
        return weights_dtype or model_dtype

    @property
    def decode_ahead(self) -> bool:
        """Whether a whole-model stage builds a request's next decode step before reading this one's token
        (decode_ahead.py): on a GPU that hides the host's build behind the device's work; on a CPU the build
        already hides in the compute, and a step computed for nothing would cost the cores a whole step."""
        return self.is_gpu

    @property
    def prefill_chunk(self) -> int:
        """Positions per prompt chunk when `--prefill-chunk` is not given: a chunk's pass at each stage is
        what a long prompt holds a short request back, seconds on a CPU at 256; a GPU computes 256 fast
        and bigger passes use it better."""
        return GPU_PREFILL_CHUNK if self.is_gpu else CPU_PREFILL_CHUNK

    @property
    def prefill_chunk_alone(self) -> int:
        """Positions per chunk of a prompt that no other request of its entry waits behind
        (entry/prompt_chunks.py): large passes cost less per position and fewer trips, but a request
        arriving meanwhile waits for the pass under way, so on a CPU it stays a fraction of a second's work."""
        return GPU_PREFILL_CHUNK_ALONE if self.is_gpu else CPU_PREFILL_CHUNK_ALONE

    @property
    def warm_batch_widths(self) -> tuple[int, ...]:
        """Batch widths whose kernels a stage runs once after loading (engine/kernel_warmup.py): CUDA compiles
        a kernel on its first use per shape, inside the first burst's steps otherwise."""
        return (1, 2, 4, 8, 16) if self.kind == "cuda" else ()

    @property
    def gguf_keeps_quantized(self) -> bool:
        """A GGUF converts to quantized MLX weights on a GPU (its quantized kernels are fast there), to
        float32 on the CPU (4-bit matmuls there are ~30x slower than float32)."""
        return self.is_gpu

    @property
    def memory_kind(self) -> str:
        return MEMORY_KIND_OF[self.kind]

    def offered_memory(self, ram_total: int, ram_available: int) -> tuple[int, int]:
        """(total, available) bytes to offer the swarm, before --memory-limit: the device's where it has
        memory of its own; on Metal also no more than the RAM free now (the working set is RAM)."""
        if self.device_total is None:
            return ram_total, ram_available
        free = self.device_total if self.device_free is None else min(self.device_free, self.device_total)
        if self.kind == "metal":
            free = min(free, ram_available)
        return self.device_total, free

    def describe(self) -> str:
        """E.g. "cuda (NVIDIA H100 80GB HBM3, 79.1 GiB GPU memory)", "cpu (Intel Xeon, RAM)"."""
        words = _MEMORY_WORDS[self.memory_kind]
        if self.device_total is None:
            return f"{self.kind} ({self.device}, {words})"
        return f"{self.kind} ({self.device}, {self.device_total / 2**30:.1f} GiB {words})"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "device": self.device, "memory_kind": self.memory_kind,
                "device_memory": self.device_total, "cpu_tuning": self.cpu_tuning, "decode_ahead": self.decode_ahead}


def describe_memory(kind: str) -> str:
    return _MEMORY_WORDS.get(kind, kind)


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def detect() -> Backend:
    """This process's backend, from MLX: Metal, else CUDA, else the CPU (or the stand-in, see above)."""
    standin = environment.DEVICE_STANDIN.get()
    if standin:
        info = json.loads(standin)
        return Backend.from_device_info(info["kind"], info)
    if mx.metal.is_available():
        return Backend.from_device_info("metal", mx.device_info(mx.gpu))
    cuda = getattr(mx, "cuda", None)  # (MLX builds before CUDA support have no mx.cuda)
    if cuda is not None and cuda.is_available():
        return Backend.from_device_info("cuda", mx.device_info(mx.gpu))
    return Backend.from_device_info("cpu", mx.device_info(mx.cpu))


@functools.lru_cache(maxsize=1)
def this_backend() -> Backend:
    """detect(), once per process (a GPU's free memory is read at the first call)."""
    return detect()
