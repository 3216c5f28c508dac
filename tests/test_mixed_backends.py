"""A swarm of a CPU node and nodes of other backends plans by each node's own memory and answers exactly.

No GPU here: two of the three nodes are stand-ins (SWARM_DEVICE_STANDIN): a CUDA box with a small card and
a Mac, described as MLX describes them. Each tells the swarm its backend and the memory it offers (the card's,
the working set), the plan follows those, and the greedy tokens through all three equal mlx-lm's alone.
The stand-ins compute on this CPU in the model's own dtype (float32 here), so exactness is checkable."""

from __future__ import annotations

import json

from swarm.bench.client import stream_completion
from swarm.bench.cluster import LocalCluster, get_json
from swarm.bench.measure import Expected, MlxLmAlone
from swarm.backend import CPU_PREFILL_CHUNK, GPU_PREFILL_CHUNK, STANDIN_ENV

MiB = 2**20
CARD = {"kind": "cuda", "device_name": "stand-in RTX", "total_memory": 1024 * MiB, "free_memory": 900 * MiB}
MAC = {"kind": "metal", "device_name": "stand-in M2", "memory_size": 4096 * MiB,
       "max_recommended_working_set_size": 1536 * MiB}


def test_cpu_cuda_and_metal_nodes_plan_by_their_own_memory_and_answer_exactly(tmp_path, llama):
    model = llama
    env = {1: {STANDIN_ENV: json.dumps(CARD)}, 2: {STANDIN_ENV: json.dumps(MAC)}}
    # every node offers at most 2 GiB: the CPU node's RAM is capped there, the card and the Mac offer less
    with LocalCluster(3, tmp_path, str(model), "2G", ready_timeout=300, node_env=env, log_level="INFO") as cluster:
        nodes = {n["id"]: n for n in cluster.topology["nodes"]}
        said = {n["backend"]: (n["memory_kind"], n["memory_available"]) for n in nodes.values()}
        assert said == {"cpu": ("ram", said["cpu"][1]), "cuda": ("gpu", 900 * MiB),
                        "metal": ("working_set", 1536 * MiB)}, said
        assert said["cpu"][1] <= 2 * 2**30
        health = {n.node_id: get_json(n.url + "/health")[1] for n in cluster.nodes}
        card = health[cluster.nodes[1].node_id]
        assert card["backend"] == "cuda" and card["device"]["device"] == "stand-in RTX"
        assert card["device"]["memory_offered"] == 900 * MiB and not card["device"]["cpu_tuning"]
        # each entry reads prompts in its own backend's chunks
        chunks = {h["backend"]: h["decode_batching"]["prompt_chunk"] for h in health.values()}
        assert chunks == {"cpu": CPU_PREFILL_CHUNK, "cuda": GPU_PREFILL_CHUNK, "metal": GPU_PREFILL_CHUNK}, chunks
        # the start line and the plan's line say it too
        card_log = cluster.nodes[1].log.read_text()
        assert "backend cuda (stand-in RTX, 1.0 GiB GPU memory), offering 0.9 GiB of GPU memory" in card_log
        assert "on cuda, 0.9 GiB gpu" in card_log and "on metal, 1.5 GiB working_set" in card_log
        # memory-proportional split (swarm-bench's --strategy memory): the CPU node holds the most layers
        layers = {s["node_id"]: s["end"] - s["start"] for s in cluster.stages}
        assert len(layers) == 3 and layers[cluster.nodes[0].node_id] == max(layers.values()), layers

        alone = MlxLmAlone(model, cast_float32=True)
        try:
            prompt = "The lighthouse keeper wrote"
            eos = frozenset(alone.tokenizer.eos_token_ids)
            want = alone.generate(list(alone.tokenizer.encode(prompt)), 16)[0]
        finally:
            alone.close()
        for _ in range(2):
            run = stream_completion(cluster.entry.url, prompt, 16)
            assert Expected(tuple(t for t in want if t not in eos), "", eos).matches(run), (run.token_ids, want)


def test_a_whole_model_gpu_node_decodes_ahead_and_answers_exactly(tmp_path, llama):
    """One node of a GPU backend (a stand-in) builds each next step before reading the token
    (engine/decode_ahead.py): its greedy tokens are mlx-lm's, alone and beside other streams. Without drafts:
    a step with drafts is built once its token is known (how many of them a random model's answer lets prompt
    lookup find is no part of this)."""
    from swarm.bench.client import concurrent_completions
    model = llama
    with LocalCluster(1, tmp_path, str(model), "2G", extra_args=("--speculate", "off"),
                      node_env={0: {STANDIN_ENV: json.dumps(CARD)}}) as cluster:
        device = get_json(cluster.entry.url + "/health")[1]["device"]
        assert device["kind"] == "cuda" and device["decode_ahead"], device
        alone = MlxLmAlone(model, cast_float32=True)
        try:
            prompt = "The lighthouse keeper wrote"
            eos = frozenset(alone.tokenizer.eos_token_ids)
            want = Expected(tuple(t for t in alone.generate(list(alone.tokenizer.encode(prompt)), 24)[0]
                                  if t not in eos), "", eos)
        finally:
            alone.close()
        for _ in range(3):
            run = stream_completion(cluster.entry.url, prompt, 24)
            assert want.matches(run), (run.token_ids, want.ids)
        _, runs = concurrent_completions(cluster.entry.url, [prompt] * 3, 24)  # batched steps settle the ones ahead
        assert all(r.tokens == runs[0].tokens for r in runs)
        run = stream_completion(cluster.entry.url, prompt, 24)  # and a lone stream after them still matches
        assert want.matches(run), (run.token_ids, want.ids)
        batching = get_json(cluster.entry.url + "/health")[1]["decode_batching"]
        assert batching["ahead_taken"] >= 4 * 20, batching  # (nearly) every lone step was the one under way
