"""A prompt alone at its entry goes in large passes, and in small ones as soon as another request runs there.

The rule (entry/prefill_chunks.py) on its own; the entry's prefill loop (entry/generate.py) on real
stages in this process, whose chunk boundaries alone are mlx-lm's at the large step (the same tokens);
and a real node, whose /health counts the prompt passes of its finished requests.
"""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path

import pytest

from swarm.bench.cluster import LocalCluster, get_json
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.engine.worker import MlxWorker
from swarm.entry.generate import GenerationJob, generate_tokens
from swarm.entry.prefill_chunks import PrefillChunks
from helpers import openai_client
from local_pipeline import LocalPipeline
from reference import reference_tokens

pytestmark = pytest.mark.timeout(300)
GREEDY = SamplingParams(temperature=0.0)


def test_alone_a_prompt_goes_in_large_chunks_beside_another_in_small_ones():
    chunks = PrefillChunks(small=16, alone=256)
    assert chunks.next(1000, alone=True) == 256
    assert chunks.next(1000, alone=False) == 16
    assert chunks.next(100, alone=True) == 100  # a chat's new turn: one pass
    assert chunks.next(5, alone=False) == 5
    assert PrefillChunks.fixed(64).next(1000, alone=True) == PrefillChunks.fixed(64).next(1000, alone=False) == 64
    with pytest.raises(ValueError, match="small <= alone"):
        PrefillChunks(small=256, alone=16)
    with pytest.raises(ValueError):
        PrefillChunks(small=0, alone=16)


class CountingPipeline(LocalPipeline):
    """Real stages in this process; records each pass's positions; another request 'arrives' after
    `alone_for` prompt passes (what the entry's own requests tell a SwarmPipeline)."""

    def __init__(self, stages, worker, alone_for: int | None = None):
        super().__init__(stages, worker)
        self.passes: list[int] = []
        self.alone_for = alone_for

    def alone(self, request_id: str) -> bool:
        return self.alone_for is None or len(self.passes) < self.alone_for

    async def forward(self, request_id, tokens, start_pos, sampling, **kw):
        self.passes.append(len(tokens))
        return await super().forward(request_id, tokens, start_pos, sampling, **kw)


def _run(model: Path, prompt: list[int], n: int, chunks: PrefillChunks, alone_for: int | None) -> tuple[list, list]:
    worker = MlxWorker()
    try:
        stages = [ShardRunner(worker.run_sync(load_shard, str(model), a, b)) for a, b in ((0, 3), (3, 6))]
        pipeline = CountingPipeline(stages, worker, alone_for)

        async def pipe(_broken=None):
            return pipeline

        async def run():
            job = GenerationJob("r1", prompt, GREEDY, n, prefill=chunks)
            return [t async for t in generate_tokens(job, pipe)]

        return asyncio.run(run()), pipeline.passes
    finally:
        worker.close()


def test_the_boundaries_alone_are_mlx_lms_at_the_large_step_and_a_newcomer_makes_them_small(model: Path):
    """Alone: every 64 positions, then the last prompt token by itself, and mlx-lm's greedy tokens at
    prefill_step_size 64 (a 2-way split). When another request arrives after the first pass, the rest of
    the prompt goes 16 at a time."""
    prompt = [3 + (i * 7) % 300 for i in range(150)]
    chunks = PrefillChunks(small=16, alone=64)
    tokens, passes = _run(model, prompt, 4, chunks, alone_for=None)
    assert passes == [64, 64, 21, 1, 1, 1, 1]
    assert tokens == [t for t, _ in reference_tokens(model, prompt, 4, prefill_step=64)]
    _, passes = _run(model, prompt, 4, chunks, alone_for=1)
    assert passes == [64] + [16] * 5 + [5, 1, 1, 1, 1]


def _prompt_chunks(url: str) -> int:
    return get_json(url + "/health")[1]["prompt_chunks"]


def test_a_node_reads_a_prompt_alone_in_large_passes_and_beside_another_in_small_ones(model: Path, tmp_path: Path):
    """On a real node (no prompt cache: every prompt read whole), a long prompt alone goes in passes of
    the backend's large chunk; the same prompt sent while another request decodes goes in many more."""
    small, alone = PrefillChunks.of_backend().small, PrefillChunks.of_backend().alone
    text = " ".join(f"w{i}" for i in range(400))
    with LocalCluster(1, tmp_path, str(model), memory_limit="1G", ready_timeout=120,
                      extra_args=("--prompt-cache", "0")) as cluster:
        url = cluster.entry.url
        client = openai_client(url)
        model_id = client.models.list().data[0].id

        def ask(content: str, max_tokens: int):
            return client.chat.completions.create(model=model_id, max_tokens=max_tokens, temperature=0,
                                                  messages=[{"role": "user", "content": content}])

        before = _prompt_chunks(url)
        reply = ask(text, 2)
        prompt_tokens = reply.usage.prompt_tokens
        assert prompt_tokens > 2 * alone, prompt_tokens  # (several large passes)
        assert _prompt_chunks(url) - before == math.ceil((prompt_tokens - 1) / alone)

        # A short chat decoding a long answer; once its first token came, the long prompt arrives beside it.
        started, beside = threading.Event(), {}

        def decode_long():
            stream = client.chat.completions.create(model=model_id, max_tokens=2000, temperature=0, stream=True,
                                                    messages=[{"role": "user", "content": "hi"}])
            for chunk in stream:
                started.set()
                if "done" in beside:
                    stream.close()  # (the long prompt's passes are counted: no need to decode on)
                    break
            started.set()

        thread = threading.Thread(target=decode_long)
        before = _prompt_chunks(url)
        thread.start()
        assert started.wait(120)
        beside["reply"] = ask(text, 2)
        beside["done"] = True
        thread.join(120)
        passes = _prompt_chunks(url) - before - 1  # (the short chat's prompt: one pass, alone)
    # (beside: small passes from its first; should the chat end first, large ones again: still more than alone)
    assert passes > math.ceil((prompt_tokens - 1) / alone), (passes, small, alone)
