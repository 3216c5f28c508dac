"""The compute backend (swarm/backend.py): what each of metal, cuda and cpu decides, from MLX's own answers.

The choice logic is driven by stand-in device descriptions shaped as `mx.device_info()` gives them on each
backend; the real-MLX tests check what this CPU box picks, and a process with a stand-in description."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx.core as mx
import pytest

from discovery.local_profile import build_local_profile
from discovery.profile import MalformedProfile, NodeProfile
from partitioner import InsufficientMemoryError, ModelSpec, NodeCapacity, make_plan
from swarm.backend import (CPU_PREFILL_CHUNK, CPU_PREFILL_CHUNK_ALONE, GPU_PREFILL_CHUNK, STANDIN_ENV, Backend, detect,
                           this_backend)

GiB = 2**30
# As MLX 0.32 describes an H100 (CUDA) and an M2 Max (Metal); the CPU gives only its name.
CUDA_INFO = {"device_name": "NVIDIA H100 80GB HBM3", "architecture": "sm_90", "total_memory": 80 * GiB,
             "free_memory": 79 * GiB, "compute_capability_major": 9, "compute_capability_minor": 0}
SMALL_CARD = {"device_name": "NVIDIA GeForce RTX 4090", "architecture": "sm_89", "total_memory": 24 * GiB,
              "free_memory": 23 * GiB}
METAL_INFO = {"device_name": "Apple M2 Max", "architecture": "applegpu_g14s", "memory_size": 64 * GiB,
              "max_recommended_working_set_size": 48 * GiB, "max_buffer_size": 32 * GiB}
CPU_INFO = {"device_name": "Intel(R) Xeon(R) Processor", "architecture": "x86_64"}


def test_each_backend_picks_its_weights_dtype():
    cuda, metal, cpu = (Backend.from_device_info("cuda", CUDA_INFO), Backend.from_device_info("metal", METAL_INFO),
                        Backend.from_device_info("cpu", CPU_INFO))
    assert cuda.weights_dtype("auto") is None and metal.weights_dtype("auto") is None  # the model's own
    assert cpu.weights_dtype("auto") == mx.float32
    for b in (cuda, metal, cpu):
        assert b.weights_dtype("native") is None
        assert b.weights_dtype("bfloat16") == mx.bfloat16 and b.weights_dtype("float32") == mx.float32
        # what goes on the wire is what the layers computed in
        assert b.wire_dtype(b.weights_dtype("auto"), mx.bfloat16) == (mx.float32 if b is cpu else mx.bfloat16)
    assert cuda.gguf_keeps_quantized and metal.gguf_keeps_quantized and not cpu.gguf_keeps_quantized


def test_only_the_cpu_backend_turns_the_cpu_tuning_on():
    assert Backend.from_device_info("cpu", CPU_INFO).cpu_tuning
    assert not Backend.from_device_info("cuda", CUDA_INFO).cpu_tuning
    assert not Backend.from_device_info("metal", METAL_INFO).cpu_tuning


def test_each_backend_picks_its_prompt_chunk_and_the_flag_overrides_it():
    """Small on the CPU (a chunk's pass is what a long prompt holds a short request back), 256 on a GPU;
    larger ones for a prompt alone at its entry (entry/prefill_chunks.py)."""
    from swarm.cli import build_parser
    from swarm.entry.generate import GenerationJob, default_prefill_step
    from swarm.entry.prefill_chunks import PrefillChunks
    from swarm.node.config import NodeConfig
    cpu = Backend.from_device_info("cpu", CPU_INFO)
    assert cpu.prefill_chunk == CPU_PREFILL_CHUNK < GPU_PREFILL_CHUNK == 256
    assert Backend.from_device_info("cuda", CUDA_INFO).prefill_chunk == 256
    assert Backend.from_device_info("metal", METAL_INFO).prefill_chunk == 256
    assert CPU_PREFILL_CHUNK < cpu.prefill_chunk_alone == CPU_PREFILL_CHUNK_ALONE
    assert Backend.from_device_info("cuda", CUDA_INFO).prefill_chunk_alone == 2048  # mlx-lm's prefill_step_size
    # no flag: the node takes its backend's (this box: the CPU's); the flag wins
    assert NodeConfig().prefill_chunk is None and build_parser().parse_args([]).prefill_chunk is None
    assert build_parser().parse_args(["--prefill-chunk", "512"]).prefill_chunk == 512
    assert default_prefill_step() == CPU_PREFILL_CHUNK
    assert GenerationJob("r", [1], None, 1).prefill == PrefillChunks(CPU_PREFILL_CHUNK, CPU_PREFILL_CHUNK_ALONE)


def test_each_backend_offers_its_own_memory():
    ram = (64 * GiB, 50 * GiB)
    card = Backend.from_device_info("cuda", SMALL_CARD)
    assert (card.memory_kind, card.offered_memory(*ram)) == ("gpu", (24 * GiB, 23 * GiB))  # the card, not the RAM
    metal = Backend.from_device_info("metal", METAL_INFO)
    assert (metal.memory_kind, metal.offered_memory(*ram)) == ("working_set", (48 * GiB, 48 * GiB))
    assert metal.offered_memory(64 * GiB, 30 * GiB) == (48 * GiB, 30 * GiB)  # unified: no more than the RAM free
    cpu = Backend.from_device_info("cpu", CPU_INFO)
    assert (cpu.memory_kind, cpu.offered_memory(*ram)) == ("ram", ram)
    # a card whose free memory MLX does not report offers all of it
    assert Backend.from_device_info("cuda", {"device_name": "x", "total_memory": 8 * GiB}).offered_memory(*ram) \
        == (8 * GiB, 8 * GiB)
    assert "24.0 GiB GPU memory" in card.describe() and "RTX 4090" in card.describe()
    with pytest.raises(ValueError, match="rocm"):
        Backend("rocm", "x")


def test_memory_limit_caps_the_device_memory_too(tmp_path):
    card = Backend.from_device_info("cuda", SMALL_CARD)
    profile = build_local_profile(state_dir=tmp_path, backend=card.kind, memory=card.offered_memory(64 * GiB, 50 * GiB),
                                  memory_kind=card.memory_kind, memory_limit=10 * GiB)
    assert (profile.memory_total, profile.memory_available, profile.memory_kind) == (24 * GiB, 10 * GiB, "gpu")


def test_the_profile_carries_the_memory_kind_both_ways(tmp_path):
    card = Backend.from_device_info("cuda", SMALL_CARD)
    profile = build_local_profile(state_dir=tmp_path, backend="cuda", memory=card.offered_memory(64 * GiB, 50 * GiB),
                                  memory_kind="gpu")
    assert NodeProfile.from_txt(profile.to_txt()) == profile
    assert NodeProfile.from_json(profile.to_json()).memory_kind == "gpu"
    # a peer of a build before memory kinds says nothing: its memory is RAM
    older = {k: v for k, v in profile.to_txt().items() if k != "mk"}
    assert NodeProfile.from_txt(older).memory_kind == "ram"
    with pytest.raises(MalformedProfile, match="memory_kind"):
        NodeProfile.from_txt({**profile.to_txt(), "mk": "swap"})


def test_a_cuda_card_smaller_than_its_ram_is_never_planned_past_the_card(tmp_path):
    """A box with a 24 GB card and 64 GB of RAM beside a CPU box of 64 GB: the card holds at most 23 GB
    (its free memory) of a 60 GB model, whatever the speeds say; alone it cannot hold the model at all."""
    card = Backend.from_device_info("cuda", SMALL_CARD)
    gpu = build_local_profile(state_dir=tmp_path / "g", backend="cuda", memory=card.offered_memory(64 * GiB, 60 * GiB),
                              memory_kind=card.memory_kind, speed=0.0001)
    cpu = build_local_profile(state_dir=tmp_path / "c", backend="cpu", memory=(64 * GiB, 60 * GiB), speed=0.01)
    spec = ModelSpec(n_layers=60, bytes_per_layer=GiB - 2**20, embedding_bytes=2**20, head_bytes=2**20)
    nodes = [NodeCapacity(p.node_id, p.memory_available, p.speed) for p in (gpu, cpu)]
    for strategy in ("balanced", "memory"):
        plan = make_plan(spec, nodes, strategy)
        held = {s.node_id: spec.range_bytes(s.start, s.end, s.start == 0, s.end == spec.n_layers) for s in plan.stages}
        assert held[gpu.node_id] <= 23 * GiB, (strategy, plan)
    with pytest.raises(InsufficientMemoryError):
        make_plan(spec, nodes[:1])


def test_this_cpu_box_picks_the_cpu_backend_from_mlx():
    assert not mx.metal.is_available() and not mx.cuda.is_available()  # this test's premise: a CPU box
    b = detect()
    assert b == Backend.from_device_info("cpu", mx.device_info(mx.cpu)) and b.kind == "cpu"
    assert b.cpu_tuning and b.weights_dtype("auto") == mx.float32 and b.device_total is None
    assert this_backend() == b


def test_a_process_with_a_standin_description_is_that_backend():
    standin = json.dumps({"kind": "cuda", **SMALL_CARD})
    code = ("from swarm.backend import this_backend; from swarm.engine.row_streams import row_groups; "
            "b = this_backend(); print(b.kind, b.weights_dtype('auto'), b.cpu_tuning, row_groups(8))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, STANDIN_ENV: standin},
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out == ["cuda", "None", "False", "[]"]  # no CPU streams for a GPU's prompt rows
