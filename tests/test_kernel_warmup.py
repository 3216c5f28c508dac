"""The passes a stage runs at the usual batch widths, run once after loading on CUDA (engine/kernel_warmup.py):
they run on every stage of a split, batching family or not, and leave nothing behind."""

from __future__ import annotations

import mlx.core as mx
import pytest

from swarm.backend import Backend
from swarm.engine.kernel_warmup import mlx_warm_up
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_warm_up_runs_on_every_stage_and_changes_no_token(random_model, family):
    model = random_model(family, n_layers=4, seed=5)
    for start, end in ((0, 2), (2, None), (0, None)):
        shard = load_shard(model, start, end)
        mlx_warm_up(shard, (1, 2, 4, 8))
        if start == 0 and end is None:
            warm, cold = ShardRunner(shard), ShardRunner(load_shard(model, 0, None))
            prompt = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
            a, b = warm.forward("r", prompt, 0, SamplingParams()), cold.forward("r", prompt, 0, SamplingParams())
            assert a == b


def test_only_cuda_warms_batch_widths_up():
    assert Backend("cuda", "x", 1, 1).warm_batch_widths == (1, 2, 4, 8, 16)
    assert Backend("metal", "x", 1, 1).warm_batch_widths == () and Backend("cpu", "x").warm_batch_widths == ()
