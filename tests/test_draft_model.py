"""Drafts from a draft model (entry/draft_model.py) through real stages in one process: greedy tokens equal
mlx-lm's through 1-, 2- and 3-way splits, whether the draft model is the served one (its drafts accepted) or
another random model of the same vocabulary (mostly rejected); a seeded sampled request draws the same
tokens; the draft cache follows the accepted history and is freed when the request ends, an error too; a
draft model whose vocabulary differs from the served model's is refused."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from swarm.engine.sampling import SamplingParams
from swarm.entry.draft_model import DraftModel, check_draft_model, mlx_load_draft
from swarm.entry.generate import GenerationJob, generate_tokens
from swarm.entry.pipeline import PipelineBroken
from swarm.entry.speculation import Speculation, SpeculationCounts, request_speculation, speculation_mode
from swarm.models.errors import ModelError
from swarm.models.resolve import resolve_model
from local_pipeline import LocalPipeline, Stages
from reference import reference_tokens

SPLITS = [[6], [1, 5], [2, 3, 1]]
PROMPT = [3, 17, 42, 5, 99, 23, 7, 64, 12, 3, 17, 42]
N = 24
OTHER = {"family": "llama", "n_layers": 2, "seed": 5}  # another model of the same tokenizer


@pytest.fixture(scope="module")
def expected(llama):
    return [t for t, _ in reference_tokens(llama, PROMPT, N)]


@pytest.fixture(scope="module")
def other(random_model):
    return random_model(**OTHER)


def draft_model(stages: Stages, path, vocab_limit: int | None = None) -> DraftModel:
    return DraftModel(stages.worker.run_sync(mlx_load_draft, path), path.name, stages.worker, vocab_limit)


@pytest.mark.parametrize("sizes", SPLITS, ids=lambda s: "-".join(map(str, s)))
def test_greedy_tokens_equal_mlx_lm_with_a_draft_model(llama, other, expected, sizes):
    stages = Stages(llama, sizes)
    try:
        for name, path in [("the served model", llama), ("another model", other)]:
            drafts = draft_model(stages, path)
            counts = SpeculationCounts()
            source = drafts.for_request()
            assert stages.run(PROMPT, N, speculation=Speculation(counts, source)) == expected, name
            assert counts.proposed > 0, name
            if path == llama:
                assert counts.accepted == counts.proposed > N // 2, counts
            else:
                assert counts.accepted < counts.proposed // 2, counts
            assert source.cache is None and drafts.requests == 0, "the draft cache is freed at the end"
    finally:
        stages.close()


def test_seeded_sampling_gives_the_same_tokens_with_a_draft_model(llama):
    # (cool enough that the draft model's greedy drafts match some draws of the random test model, not all)
    sampling = SamplingParams(temperature=0.05, top_p=0.95, top_k=40, seed=77)
    stages = Stages(llama, [3, 3])
    try:
        plain = stages.run(PROMPT, N, sampling)
        counts = SpeculationCounts()
        drafted = stages.run(PROMPT, N, sampling, speculation=Speculation(counts, draft_model(stages, llama)
                                                                         .for_request()))
        assert drafted == plain
        assert counts.proposed > counts.accepted > 0, counts
    finally:
        stages.close()


def test_the_draft_cache_holds_the_accepted_history_and_goes_in_chunks(llama, expected):
    stages = Stages(llama, [6])
    try:
        model = draft_model(stages, llama)
        model.chunk = 5  # (a prompt of 12 goes in three jobs)
        source = model.for_request()
        history = PROMPT + expected[:3]

        async def go():
            first = await source(history, 4)
            assert first == expected[3:7], "the served model's own greedy tokens"
            assert source.held == history + first[:3] and source.offset() == len(history) + 3
            # two accepted, then another token: the cache drops the rejected positions and reads the new one
            after = history + first[:2] + [7]
            again = await source(after, 2)
            assert len(again) == 2 and source.held == after + again[:1] and source.offset() == len(after) + 1
            # the same history again (a replay): its last token is read again
            assert await source(after, 2) == again
            source.close()
            await stages.worker.run(lambda: None)  # (the free was posted to the MLX thread)
        asyncio.run(go())
        assert source.cache is None and model.requests == 0
        assert model.jobs >= 3 + 2, "the prompt went in chunks of 5 positions"
    finally:
        stages.close()


def test_a_request_that_fails_frees_its_draft_cache(llama):
    stages = Stages(llama, [2, 4])
    try:
        model = draft_model(stages, llama)

        class Failing(LocalPipeline):
            async def forward(self, request_id, tokens, start_pos, sampling, *args, drafts=None, **kwargs):
                if drafts:
                    raise RuntimeError("the client went away")
                return await super().forward(request_id, tokens, start_pos, sampling, *args, **kwargs)
        pipeline = Failing(stages.stages, stages.worker)

        async def pipe(_broken=None):
            return pipeline

        async def go():
            job = GenerationJob("r", PROMPT, SamplingParams(temperature=0.0), N,
                                speculation=Speculation(source=model.for_request()))
            with pytest.raises(RuntimeError):
                async for _ in generate_tokens(job, pipe):
                    pass
            await stages.worker.run(lambda: None)
        asyncio.run(go())
        assert model.requests == 0
    finally:
        stages.close()


def test_drafts_stop_below_the_served_models_vocabulary(llama, expected):
    stages = Stages(llama, [6])
    try:
        ahead = expected[3:7]
        source = draft_model(stages, llama, vocab_limit=max(ahead)).for_request()
        got = asyncio.run(source(PROMPT + expected[:3], 4))
        assert got == ahead[:ahead.index(max(ahead))], "cut at the first id at or past it"
        source.close()
    finally:
        stages.close()


def test_auto_with_a_draft_model_looks_up_first_and_asks_the_model_otherwise(llama, other, expected):
    assert speculation_mode("auto", True, draft_model=True) == "lookup+draft"
    assert speculation_mode("draft", True, draft_model=True) == "draft"
    assert speculation_mode("lookup", True, draft_model=True) == "lookup"
    assert speculation_mode("draft", False, draft_model=True) == "off"
    assert speculation_mode("auto", True) == "lookup" and speculation_mode("off", True, draft_model=True) == "off"
    stages = Stages(llama, [2, 4])
    try:
        model = draft_model(stages, other)
        counts = SpeculationCounts()
        spec = request_speculation("lookup+draft", counts, model)
        # a history whose last three tokens came before: lookup proposes what followed them, the model is not asked
        looked_up = asyncio.run(spec.source([1, 2, 3, 4, 5, 1, 2, 3], 3))
        assert looked_up == [4, 5, 1] and model.jobs == 0
        assert stages.run(PROMPT, N, speculation=spec) == expected
        assert model.jobs > 0 and counts.proposed > 0
        assert request_speculation("off", counts, model) is None
    finally:
        stages.close()


def test_a_draft_model_with_another_vocabulary_is_refused(tmp_path, llama, random_model):
    from mlx_lm.utils import load_tokenizer
    served = resolve_model(str(llama), tmp_path / "cache")
    tokenizer = load_tokenizer(served.path)
    assert check_draft_model(str(llama), served, tokenizer, tmp_path / "cache").path == served.path
    # the same size, two tokens swapped
    swapped = tmp_path / "swapped"
    shutil.copytree(llama, swapped)
    spec = json.loads((swapped / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = "he", "ar"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(spec))
    more = random_model("llama", n_layers=2, seed=5, tools_template=True)  # two tokens more
    for path in (swapped, more):
        with pytest.raises(ModelError) as e:
            check_draft_model(str(path), served, tokenizer, tmp_path / "cache")
        text = str(e.value)
        assert "vocabular" in text and str(path) in text and served.model_id in text, text
    with pytest.raises(ModelError) as e:
        check_draft_model(str(tmp_path / "nowhere"), served, tokenizer, tmp_path / "cache")
    assert "nowhere" in str(e.value)
    with pytest.raises(ModelError) as e:
        check_draft_model("mlx-community/Not-Cached-4bit", served, tokenizer, tmp_path / "cache")
    assert "Not-Cached-4bit" in str(e.value) and "draft" in str(e.value)
