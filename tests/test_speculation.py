"""Steps that carry drafts (entry/speculation.py, ShardRunner._verify): real MLX, real shard runners chained
in this process (tests/local_pipeline.py). Greedy output equals mlx-lm's greedy generate and the output
without drafts, token for token, through 1-, 2- and 3-way splits, whether drafts are all accepted, all
rejected or found by prompt lookup; a seeded sampled request gives the same tokens; max_tokens and EOS
crossed by accepted drafts cut there; the caches a speculative turn leaves serve the next turn."""

from __future__ import annotations

import asyncio
import logging

import mlx.core as mx
import pytest
from local_pipeline import LocalPipeline
from reference import reference_tokens

from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import check_splittable, load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.engine.worker import MlxWorker
from swarm.entry.generate import GenerationJob, generate_tokens
from swarm.entry.prompt_index import PromptIndex
from swarm.entry.speculation import RequestSpeculation, Speculation, lookup_drafts, speculation_for

GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=5)
MODEL = {"n_layers": 6, "seed": 1}
SPLITS = [(6,), (2, 4), (1, 3, 2)]
# a prompt that repeats itself: the model's answer and the lookup drafts overlap
PROMPT = [(i * 7) % 40 + 20 for i in range(30)] * 2
NEW = 24


@pytest.fixture(scope="module")
def worker():
    w = MlxWorker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def llama_dir(random_model):
    return random_model("llama", **MODEL)


def stages(model_dir, worker, sizes, prompt_cache_bytes=0) -> list[ShardRunner]:
    bounds = [0, *[sum(sizes[:i + 1]) for i in range(len(sizes))]]
    return [ShardRunner(worker.run_sync(load_shard, model_dir, a, b), prompt_cache_bytes=prompt_cache_bytes)
            for a, b in zip(bounds, bounds[1:])]


class Scripted(RequestSpeculation):
    """Drafts from a script: `truth` (the tokens the request will produce) offered as they are (all accepted)
    or each one changed (all rejected)."""

    def __init__(self, truth: list[int], prompt_len: int, wrong: bool, k: int = 4):
        super().__init__(Speculation())
        self.truth, self.prompt_len, self.wrong, self.k = truth, prompt_len, wrong, k
        self.steps: list[tuple[int, int]] = []

    def arm_next(self) -> bool:
        return False

    def drafts(self, history, room):
        done = len(history) - self.prompt_len  # tokens generated so far: the drafts guess truth[done:]
        drafts = self.truth[done:done + min(self.k, room)]
        return [(t + 1) % 256 for t in drafts] if self.wrong else drafts

    def checked(self, proposed, tokens):
        super().checked(proposed, tokens)
        self.steps.append((proposed, tokens))


def generate(pipeline, prompt, sampling=GREEDY, spec=None, max_tokens=NEW, eos=frozenset(), rid="r"):
    async def pipe(_broken=None):
        return pipeline

    async def run():
        job = GenerationJob(rid, prompt, sampling, max_tokens, eos_ids=eos, speculation=spec)
        return [t async for t in generate_tokens(job, pipe)]
    return asyncio.run(run())


def test_lookup_drafts_take_the_latest_earlier_occurrence():
    assert lookup_drafts([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 2) == [7, 5]
    assert lookup_drafts([4, 5, 6, 4], 3) == [5, 6, 4]  # (a 1-gram when no longer one occurs)
    assert lookup_drafts([4, 5, 6, 4], 3, min_ngram=2) == []
    assert lookup_drafts([1, 2, 3], 4) == []
    assert lookup_drafts([1, 2, 1, 2], 0) == []


@pytest.mark.parametrize("sizes", SPLITS, ids=lambda s: f"{len(s)}-way")
def test_greedy_equals_mlx_lm_with_drafts_accepted_rejected_and_looked_up(llama_dir, worker, sizes):
    expected = [t for t, _ in reference_tokens(llama_dir, PROMPT, NEW)]
    pipeline = LocalPipeline(stages(llama_dir, worker, sizes), worker)
    assert generate(pipeline, PROMPT) == expected
    accepted = Scripted(expected, len(PROMPT), wrong=False)
    assert generate(pipeline, PROMPT, spec=accepted) == expected
    assert all(tokens == proposed + 1 for proposed, tokens in accepted.steps)
    assert len(accepted.steps) < NEW // 3  # 5 tokens a pass
    rejected = Scripted(expected, len(PROMPT), wrong=True)
    assert generate(pipeline, PROMPT, spec=rejected) == expected
    assert all(tokens == 1 for _, tokens in rejected.steps) and len(rejected.steps) == NEW
    policy = Speculation()
    assert generate(pipeline, PROMPT, spec=policy.for_request()) == expected
    assert policy.stats.proposed > 0
    for stage in pipeline.stages:
        assert stage.active_requests == 0 and stage.budget.positions == 0  # trimmed positions uncounted too


def test_seeded_sampled_request_gives_the_same_tokens_with_drafts(llama_dir, worker):
    pipeline = LocalPipeline(stages(llama_dir, worker, (2, 4)), worker)
    plain = generate(pipeline, PROMPT, SEEDED)
    assert generate(pipeline, PROMPT, SEEDED, spec=Scripted(plain, len(PROMPT), wrong=False)) == plain
    assert generate(pipeline, PROMPT, SEEDED, spec=Scripted(plain, len(PROMPT), wrong=True)) == plain
    assert generate(pipeline, PROMPT, SEEDED, spec=Speculation().for_request()) == plain


def test_accepted_drafts_stop_at_max_tokens_and_eos(llama_dir, worker):
    pipeline = LocalPipeline(stages(llama_dir, worker, (3, 3)), worker)
    expected = generate(pipeline, PROMPT)
    spec = Scripted(expected, len(PROMPT), wrong=False, k=8)
    assert generate(pipeline, PROMPT, spec=spec, max_tokens=7) == expected[:7]
    assert max(p for p, _ in spec.steps) <= 6  # a step never asks past max_tokens
    eos = expected[5]
    cut = expected[:expected.index(eos) + 1]
    spec = Scripted(expected, len(PROMPT), wrong=False, k=8)
    assert generate(pipeline, PROMPT, spec=spec, eos=frozenset({eos})) == cut
    assert spec.steps[0][1] > len(cut)  # the drafts crossed the EOS: the tokens after it are dropped


def test_a_speculative_turn_leaves_caches_the_next_turn_reuses(llama_dir, worker):
    index = PromptIndex()
    pipeline = LocalPipeline(stages(llama_dir, worker, (2, 4), prompt_cache_bytes=32 << 20), worker, index)
    cold = LocalPipeline(stages(llama_dir, worker, (2, 4)), worker)
    first = generate(pipeline, PROMPT, spec=Scripted(generate(cold, PROMPT), len(PROMPT), wrong=True), rid="t1")
    turn2 = PROMPT + first + [21, 22, 23, 24]
    assert generate(pipeline, turn2, rid="t2", spec=Speculation().for_request()) == generate(cold, turn2)
    assert sum(s.prompt_stats().hits for s in pipeline.stages) == len(pipeline.stages)


# Families whose caches take drafts back (KVCache only), each with work outside its layers that a split must
# keep (embedding scales, logit soft-caps and scales, MoE, MLA attention), and families that cannot (a rotating
# window, a recurrent state): speculation is off for those, said at start.
TRIMMABLE_FAMILIES = ["qwen3", "gemma", "gemma2", "granite", "cohere", "mixtral", "deepseek_v3", "phi3"]
UNTRIMMABLE_FAMILIES = ["gemma3_text", "gpt_oss", "qwen3_next", "mamba"]


@pytest.mark.parametrize("family", TRIMMABLE_FAMILIES)
def test_zoo_families_give_mlx_lm_greedy_tokens_with_drafts_over_a_split(random_model, worker, family):
    path = random_model(family, n_layers=4, seed=1)
    prompt = PROMPT[:40]
    expected = [t for t, _ in reference_tokens(path, prompt, 12)]
    pipeline = LocalPipeline(stages(path, worker, (1, 3)), worker)
    for wrong in (False, True):
        assert generate(pipeline, prompt, spec=Scripted(expected, len(prompt), wrong), max_tokens=12) == expected


@pytest.mark.parametrize("family", UNTRIMMABLE_FAMILIES + ["llama"])
def test_speculation_is_off_for_models_whose_caches_cannot_be_trimmed(random_model, family, caplog):
    outlined = check_splittable(random_model(family, n_layers=4, seed=1))
    with caplog.at_level(logging.INFO, logger="swarm.entry.speculation"):
        policy = speculation_for("auto", outlined)
    assert policy.enabled == (family == "llama")
    assert ("speculative decoding off" in caplog.text) == (family != "llama")
    assert not speculation_for("off", outlined).enabled


def test_a_batched_step_after_rejected_drafts_trims_them_first(llama_dir, worker):
    """Another request's step may share a batched pass with the one after a draft-checking step (a stage
    batches steps of any entries): that step starts below what the stage holds, and is trimmed there too."""
    [stage] = stages(llama_dir, worker, (6,))
    expected = [t for t, _ in reference_tokens(llama_dir, PROMPT, 3)]

    def run():
        for rid in ("a", "b"):
            stage.forward(rid, mx.array([PROMPT[:-1]]), 0)
        first = stage.forward("a", mx.array([PROMPT[-1:]]), len(PROMPT) - 1, GREEDY)
        ids = [PROMPT[-1], (first + 1) % 256, 7, 9]
        assert stage.forward("b", mx.array([ids]), len(PROMPT) - 1, GREEDY, ids=ids) == [first]  # all rejected
        a, b = stage.decode_batch([("a", mx.array([[first]]), len(PROMPT), GREEDY),
                                   ("b", mx.array([[first]]), len(PROMPT), GREEDY)])
        return first, a, b
    first, a, b = worker.run_sync(run)
    assert [first, a] == expected[:2] and b == a
