"""Batched decode (on by default, `--batch-decode 8`): decode steps of concurrent requests share one pass.

With the bundled reference BLAS a matmul row does not depend on the other rows,
so batched requests must produce exactly the tokens each would alone (families
without a proven batched pass run their rows one by one, exact by construction); that makes
the test able to catch a row mixed up with another, a cache applied to the wrong
request or a token sampled at the wrong position.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import pytest

from swarm.bench.cluster import LocalCluster, get_json
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.node.config import DEFAULT_BATCH_DECODE
from helpers import NARROW_SHAPE, chat_body
from reference import reference_chat

MAX_TOKENS = 24
PROMPTS = ["Tell me about cats.", "Count to twenty, please.", "What is a bridge?", "Write a haiku on rain.",
           "Name three rivers.", "Why is the sky blue?"]


def _chat(url: str, content: str) -> str:
    model = get_json(url + "/v1/models")[1]["data"][0]["id"]
    body = json.dumps({"model": model, **chat_body(content, MAX_TOKENS)}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


# The families the unrolled batched pass is allowed for, then families it must not
# take (glm4's extra post-norms were skipped once; Ministral-style llama has sliding
# layers), then families of every other kind (their rows run one by one).
UNROLLED = ["qwen3", "llama", "qwen2"]
OTHERS = ["glm4", "ministral", "gemma3_text", "gpt_oss", "deepseek_v3", "granite", "cohere2", "qwen3_next",
          "mamba", "nemotron_h"]


@pytest.fixture(scope="module", params=UNROLLED + OTHERS)
def family_model(request, random_model) -> tuple[str, Path]:
    return request.param, random_model(request.param, **NARROW_SHAPE)


@pytest.mark.parametrize("bounds", [(0, None), (0, 2), (2, 5), (5, None)])
def test_batched_stage_equals_one_request_at_a_time(family_model, bounds) -> None:
    """In process: ShardRunner.decode_batch against ShardRunner.forward, rows of different lengths
    and contexts past the sliding windows, on every stage position (first, middle, last, alone)."""
    family, model = family_model
    single, batched = (ShardRunner(load_shard(model, *bounds)) for _ in range(2))
    assert batched.shard.unrolls_decode == (family in UNROLLED), "only proven families take the unrolled pass"
    first, last = bounds[0] == 0, bounds[1] is None
    prompts = [[5, 9, 13, 2, 7, 1, 3, 9, 2], [3, 3], [11, 4, 8, 1, 9, 6, 2, 10, 5, 7, 7, 8, 2]]
    hidden = {i: mx.random.normal((1, len(p), 128), key=mx.random.key(i)) for i, p in enumerate(prompts)}

    def step_input(i: int, token: int, pos: int) -> mx.array:
        return mx.array([[token]]) if first else mx.random.normal((1, 1, 128), key=mx.random.key(100 * i + pos))
    greedy, seeded = SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    sampling = [greedy, seeded, greedy] if last else [None] * 3
    tokens = []
    for i, p in enumerate(prompts):
        x = mx.array([p[:-1]]) if first else hidden[i][:, :-1]
        for stage in (single, batched):
            stage.forward(f"r{i}", x, 0)
        tokens.append(p[-1])
    for step in range(12):  # the longest context ends at 24 positions: three windows of 8
        items = [(f"r{i}", step_input(i, t, len(p) - 1 + step), len(p) - 1 + step, sampling[i])
                 for i, (p, t) in enumerate(zip(prompts, tokens))]
        expected = [single.forward(*item) for item in items]
        got = batched.decode_batch(items)
        if last:
            assert got == expected, f"{family} {bounds} step {step}"
            tokens = expected
        else:
            for g, e in zip(got, expected):
                assert mx.array_equal(g, e), f"{family} {bounds} step {step}"
    # a request whose cache does not hold the position fails alone
    pos = len(prompts[1]) - 1 + 12
    out = batched.decode_batch([("r0", step_input(0, 1, 3), 3, greedy), ("r1", step_input(1, 1, pos), pos, greedy)])
    assert type(out[0]).__name__ == "CacheMismatch" and not isinstance(out[1], Exception)


def test_concurrent_requests_batch_across_a_two_node_swarm(model: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SWARM_BLAS", "off")  # the nodes keep the reference BLAS: rows independent, see above
    expected = {p: reference_chat(model, [{"role": "user", "content": p}], MAX_TOKENS)[0] for p in PROMPTS}
    with LocalCluster(2, tmp_path, str(model), memory_limit="1G", ready_timeout=120) as cluster:  # the defaults
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(pool.map(lambda p: _chat(cluster.entry.url, p), PROMPTS))
        batching = [get_json(n.url + "/health")[1]["decode_batching"] for n in cluster.nodes]
    assert dict(zip(PROMPTS, answers)) == expected
    assert all(b["max_batch"] == DEFAULT_BATCH_DECODE for b in batching), batching  # batching is on by default
    assert sum(b["batched_passes"] for b in batching) > 0, f"no step was batched: {batching}"
