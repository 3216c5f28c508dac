"""New prompts are taken in between passes, on real node processes with the official openai client.

Two ways a stage's MLX thread kept new prompts waiting while it had work queued:
- On a node that is its own next stage (one node), a request's decode steps follow each
  other on that thread, and new requests' prompts, posted by the event loop, waited for
  the whole stream to end (engine/worker.py `mlx_take_in`).
- A later stage computed the prompts a first stage had batched one by one, as each
  frame (MBs) landed, instead of together (stage/stage_service.py `_with_queued_prompts`).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from swarm.bench.cluster import LocalCluster, get_json
from model_zoo import build_random_model

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_random_model(tmp_path_factory.mktemp("take_in") / "m", family="qwen3", n_layers=6, hidden=256,
                              heads=8, kv_heads=2, intermediate=768, seed=7)


def client_of(node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_a_new_request_is_answered_while_another_streams_on_one_node(model: Path, tmp_path: Path) -> None:
    eos = json.loads((model / "config.json").read_text())["eos_token_id"]
    with LocalCluster(1, tmp_path, str(model), memory_limit="1G", ready_timeout=120) as cluster:
        client = client_of(cluster.entry)
        model_id = client.models.list().data[0].id
        long_chunks: list[float] = []
        started = threading.Event()

        def long_stream() -> str | None:
            stream = client.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "Go on and on."}], max_tokens=1500,
                temperature=0, logit_bias={str(eos): -100}, stream=True)  # never ends early
            finish = None
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    long_chunks.append(time.monotonic())
                    if len(long_chunks) == 20:
                        started.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            return finish

        with ThreadPoolExecutor(1) as pool:
            long_one = pool.submit(long_stream)
            assert started.wait(120)
            short = client.chat.completions.create(model=model_id, max_tokens=2, temperature=0,
                                                   messages=[{"role": "user", "content": "Hi."}])
            answered = time.monotonic()
            assert long_one.result(timeout=240) == "length"
    assert short.choices[0].message.content is not None
    after = sum(1 for t in long_chunks if t > answered)
    assert after >= 100, (f"the short request was answered when the long stream had {len(long_chunks) - after} "
                          f"of its {len(long_chunks)} tokens: it waited for the stream instead of joining it")


def test_prompts_batched_at_the_first_stage_are_batched_at_every_stage(model: Path, tmp_path: Path) -> None:
    # Long prompts, so that each prompt's activations are a frame of MBs that lands in several reads.
    prompts = [f"{i} " + "the river runs past the old mill and on to the sea " * 25 for i in range(6)]
    with LocalCluster(3, tmp_path, str(model), memory_limit="1G", ready_timeout=120) as cluster:  # an even split
        client = client_of(cluster.entry)
        model_id = client.models.list().data[0].id

        def ask(prompt: str):
            return client.chat.completions.create(model=model_id, max_tokens=2, temperature=0,
                                                  messages=[{"role": "user", "content": prompt}])
        with ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(ask, prompts))
        by_stage = {s["node_id"]: s["start"] for s in cluster.stages}
        batching = sorted((by_stage[n.node_id], get_json(n.url + "/health")[1]["decode_batching"])
                          for n in cluster.nodes)
    assert all(a.usage.prompt_tokens > 200 for a in answers), [a.usage.prompt_tokens for a in answers]
    first = batching[0][1]
    assert first["prompt_passes"] >= 1, f"the first stage batched no prompts: {batching}"
    for start, later in batching[1:]:
        assert later["prompt_rows"] >= first["prompt_rows"], (
            f"the stage at layer {start} computed alone prompts the first stage had batched: {batching}")
