"""Chaining K shards in one process gives exactly mlx_lm.generate's greedy tokens."""

from __future__ import annotations

import asyncio

import pytest

from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.engine.worker import MlxWorker
from swarm.node.config import MIN_PREFILL_CHUNK
from swarm.entry.generate import GenerationJob, generate_tokens
from helpers import TINY_FAMILIES
from local_pipeline import LocalPipeline, ranges
from reference import PREFILL_STEP, reference_tokens

GREEDY = SamplingParams(temperature=0.0)


def chained_tokens(model_dir, sizes: list[int], prompt: list[int], n: int,
                   sampling: SamplingParams = GREEDY, prefill_step: int = PREFILL_STEP) -> list[int]:
    worker = MlxWorker()
    try:
        stages = [ShardRunner(worker.run_sync(load_shard, model_dir, a, b)) for a, b in ranges(sizes)]
        pipeline = LocalPipeline(stages, worker)

        async def pipe(_broken=None):
            return pipeline

        async def run():
            job = GenerationJob("r1", prompt, sampling, n, prefill_step=prefill_step, prefill_alone=prefill_step)
            return [t async for t in generate_tokens(job, pipe)]

        tokens = asyncio.run(run())
        assert all(s.active_requests == 0 for s in stages), "caches must be freed at the end"
        return tokens
    finally:
        worker.close()


TINY_SPLITS = [[6], [1, 5], [4, 2], [2, 3, 1], [1, 1, 3, 1], [1, 2, 2, 1]]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_families_match_mlx_lm_for_1_to_4_stages(tiny_models, family):
    model_dir = tiny_models[family]
    prompt = [3, 17, 42, 5, 99, 23, 7, 64, 12]
    expected = [token for token, _ in reference_tokens(model_dir, prompt, 24)]
    assert len(set(expected)) > 3, "the test model must not collapse into one token"
    for sizes in TINY_SPLITS:
        assert chained_tokens(model_dir, sizes, prompt, 24) == expected, f"split {sizes}"


DEFAULT_SPLITS = [[30], [7, 23], [1, 14, 15], [3, 9, 11, 7]]


@pytest.mark.node_blas  # (the whole model, four times: several times faster than under the bundled BLAS)
def test_default_model_matches_mlx_lm_for_1_to_4_stages(default_model):
    from mlx_lm.utils import load_tokenizer
    tok = load_tokenizer(default_model.path)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                     add_generation_prompt=True)
    expected = [token for token, _ in reference_tokens(default_model.path, prompt, 10)]
    for sizes in DEFAULT_SPLITS:
        assert chained_tokens(default_model.path, sizes, prompt, 10) == expected, f"split {sizes}"


def test_seeded_sampling_is_the_same_across_splits(tiny_models):
    model_dir = tiny_models["qwen3"]
    prompt = [5, 6, 7, 8]
    sampling = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    one = chained_tokens(model_dir, [6], prompt, 16, sampling)
    assert chained_tokens(model_dir, [2, 4], prompt, 16, sampling) == one
    other_seed = chained_tokens(model_dir, [6], prompt, 16, SamplingParams(0.9, 0.95, 50, 99))
    assert other_seed != one


@pytest.mark.node_blas
def test_a_prompt_of_several_chunks_matches_mlx_lm_at_the_same_prefill_step(default_model):
    """A prompt longer than one chunk (`--prefill-chunk`) is read chunk by chunk by every stage, as
    mlx-lm reads it at that prefill_step_size: the same tokens (tests/reference.py). The smallest chunk
    a node accepts keeps the prompt short while it still spans several chunks and a partial last one."""
    from mlx_lm.utils import load_tokenizer
    tok = load_tokenizer(default_model.path)
    step = MIN_PREFILL_CHUNK
    text = " ".join(f"Item {i}: a {['red', 'green', 'blue'][i % 3]} box." for i in range(6))
    prompt = tok.apply_chat_template([{"role": "user", "content": text + " Which colour comes first?"}],
                                     add_generation_prompt=True)
    assert len(prompt) > 3 * step + 1 and (len(prompt) - 1) % step, "several chunks and a partial one"
    expected = [token for token, _ in reference_tokens(default_model.path, prompt, 6, prefill_step=step)]
    assert chained_tokens(default_model.path, [10, 10, 10], prompt, 6, prefill_step=step) == expected
