"""The entry's side of the prompt cache (entry/prompt_index.py, entry/generate.py): a conversation's next
turn starts from what the last one left on every stage and gives the tokens a cold run gives; a stage
that lost its entry makes the request run cold at once, with no error; decoding rules, replays and
re-plans hold. Stages chained in this process (tests/local_pipeline.py)."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import pytest
from local_pipeline import LocalPipeline
from mlx_lm.utils import load_tokenizer

from partitioner import ModelSpec
from partitioner.model import Plan, Stage

from swarm.engine.constraints import GrammarVocab
from swarm.engine.decoding_rules import DecodingRules
from swarm.engine.prompt_cache import PromptCacheSize
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.engine.worker import MlxWorker
from swarm.entry.generate import GenerationJob, generate_tokens
from swarm.entry.grammars import json_schema_grammar
from swarm.entry.pipeline import PipelineBroken
from swarm.entry.prompt_index import MIN_REUSE, PromptIndex, route_of
from swarm.stage.stage_host import StageHost

GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=5)
TURNS = [[(i * 31 + 7 * k) % 300 + 20 for i in range(24 + 3 * k)] for k in range(3)]
NEW = 8


@pytest.fixture(scope="module")
def worker():
    w = MlxWorker()
    yield w
    w.close()


def stages(model_dir, worker, sizes=(2, 4), budget=32 << 20, vocab=None) -> list[ShardRunner]:
    bounds = [0, *[sum(sizes[:i + 1]) for i in range(len(sizes))]]
    return [ShardRunner(worker.run_sync(load_shard, model_dir, a, b), prompt_cache_bytes=budget, vocab=vocab)
            for a, b in zip(bounds, bounds[1:])]


def generate(pipeline, rid: str, prompt: list[int], sampling=GREEDY, rules=None) -> list[int]:
    async def pipe(_broken=None):
        return pipeline

    async def run():
        job = GenerationJob(rid, prompt, sampling, NEW, rules=rules)
        return [t async for t in generate_tokens(job, pipe)]
    return asyncio.run(run())


def conversation(pipeline, sampling=GREEDY, rules_of=None, between=None) -> list[list[int]]:
    """Three turns, each prompt the whole history so far plus the turn's new tokens."""
    history, answers = [], []
    for k, new in enumerate(TURNS):
        if between is not None and k:
            between(k)
        history = history + new
        rules = rules_of(len(history)) if rules_of else None
        answer = generate(pipeline, f"turn{k}", history, sampling, rules)
        answers.append(answer)
        history = history + answer
    return answers


def test_each_turn_starts_from_the_last_and_equals_a_cold_run(llama, worker):
    warm = stages(llama, worker)
    got = conversation(LocalPipeline(warm, worker, PromptIndex()))
    assert got == conversation(LocalPipeline(stages(llama, worker, budget=0), worker))
    for stage in warm:
        stats = stage.prompt_stats()
        assert stats.hits == 2 and stats.misses == 0
        # turn 2 reused turn 1's prompt and all but its last answer token; turn 3 likewise
        assert stats.tokens_saved == (len(TURNS[0]) + NEW - 1) + (len(TURNS[0]) + len(TURNS[1]) + 2 * NEW - 1)
    assert all(s.active_requests == 0 for s in warm), "requests' own caches are freed at the end"


def test_a_grammar_holds_from_a_kept_prefix(llama, worker):
    schema = {"type": "object", "additionalProperties": False, "required": ["a"],
              "properties": {"a": {"type": "string", "maxLength": 4}}}

    def rules_of(prompt_len):
        return DecodingRules(prompt_len=prompt_len, grammar=json_schema_grammar(schema))
    vocab = GrammarVocab(load_tokenizer(llama))
    warm = stages(llama, worker, vocab=vocab)
    got = conversation(LocalPipeline(warm, worker, PromptIndex()), SEEDED, rules_of)
    assert got == conversation(LocalPipeline(stages(llama, worker, budget=0, vocab=vocab), worker), SEEDED, rules_of)
    assert warm[-1].prompt_stats().hits == 2


class SameRoute(LocalPipeline):
    """A stage restarted on the same node with the same layers: the entry's route is unchanged."""

    route = ("n1", "n2")


def test_a_stage_that_lost_its_cache_makes_the_turn_run_cold_without_an_error(llama, worker):
    warm = stages(llama, worker)
    index = PromptIndex()

    def restart_the_last_stage(k):
        if k == 1:
            warm[1] = stages(llama, worker)[1]
    got = conversation(SameRoute(warm, worker, index), between=restart_the_last_stage)
    assert got == conversation(LocalPipeline(stages(llama, worker, budget=0), worker))
    assert warm[1].prompt_stats().misses == 1 and warm[1].prompt_stats().hits == 1  # turn 2 missed, turn 3 hit
    assert warm[0].prompt_stats().hits == 2  # stage 0 started turn 2 from its cache, then ran it again cold


def test_decoding_rules_hold_from_a_kept_prefix(llama, worker):
    """The last stage's sampler sees the prefix's ids too: a repetition penalty counts the whole prompt."""
    def rules_of(prompt_len):
        return DecodingRules(prompt_len=prompt_len, repetition_penalty=1.3, presence_penalty=0.5, logprobs=2)
    warm = stages(llama, worker)
    got = conversation(LocalPipeline(warm, worker, PromptIndex()), SEEDED, rules_of)
    assert got == conversation(LocalPipeline(stages(llama, worker, budget=0), worker), SEEDED, rules_of)
    assert warm[-1].prompt_stats().hits == 2


def test_a_replan_between_turns_gives_the_same_text(llama, worker):
    """The layers move between turns: the new stages keep nothing and the entry's route changed, so the
    turn runs cold without trying; the one after reuses the new stages' caches."""
    pipeline = LocalPipeline(stages(llama, worker, (2, 4)), worker, PromptIndex())

    def replan(k):
        if k == 1:
            pipeline.stages = stages(llama, worker, (3, 2, 1))
    got = conversation(pipeline, between=replan)
    assert got == conversation(LocalPipeline(stages(llama, worker, budget=0), worker))
    assert all(s.prompt_stats().misses == 0 and s.prompt_stats().hits == 1 for s in pipeline.stages)


class BreakOnce(LocalPipeline):
    """Breaks (as a dead stage does) at its third sampled step, once."""

    sampled = 0

    async def forward(self, request_id, tokens, start_pos, sampling, continue_unless=None, rules=None, prefix=None,
                      attempt=0):
        if sampling is not None:
            BreakOnce.sampled += 1
            if BreakOnce.sampled == 3:
                raise PipelineBroken("stage killed")
        return await super().forward(request_id, tokens, start_pos, sampling, continue_unless, rules, prefix)


def test_a_replay_starts_from_the_cache(llama, worker):
    warm = stages(llama, worker)
    pipeline = BreakOnce(warm, worker, PromptIndex())
    history = TURNS[0]
    first = generate(pipeline, "t1", history)
    BreakOnce.sampled = 0
    second = generate(pipeline, "t2", history + first + TURNS[1])
    cold = LocalPipeline(stages(llama, worker, budget=0), worker)
    assert [first, second] == [generate(cold, "c1", history), generate(cold, "c2", history + first + TURNS[1])]
    assert warm[0].prompt_stats().hits == 2  # the second turn, and its replay after the break


def test_the_entry_reuses_only_through_the_same_route():
    index = PromptIndex()
    a = route_of(Plan(ModelSpec(6, 1), "balanced", (Stage("n1", 0, 3), Stage("n2", 3, 6)), (), 0.0, "p1"))
    same = route_of(Plan(ModelSpec(6, 1), "balanced", (Stage("n1", 0, 3), Stage("n2", 3, 6)), (), 0.0, "p2"))
    moved = route_of(Plan(ModelSpec(6, 1), "balanced", (Stage("n1", 0, 2), Stage("n2", 2, 6)), (), 0.0, "p3"))
    kept = list(range(100, 140))
    index.add(a, kept)
    assert index.reuse(same, kept + [1, 2]).length == len(kept)  # another plan id, the same stages: reused
    assert index.reuse(moved, kept + [1, 2]) is None
    assert index.reuse(a, kept[:MIN_REUSE - 1] + [1, 2]) is None  # too little shared to be worth it
    partial = index.reuse(a, kept[:30] + [1, 2])
    assert partial.length == 30 and not partial.whole
    index.missed(a, kept[:30] + [1, 2], partial)  # a stage could not cut it back: whole sequences only now
    assert index.reuse(a, kept[:30] + [1, 2]) is None
    assert index.reuse(a, kept + [1]).whole


def test_a_stage_whose_layers_change_drops_its_prompts(llama, worker):
    async def run():
        host = StageHost(llama, None, worker, prompt_cache=PromptCacheSize(16 << 20))
        spec = ModelSpec(6, 1)
        await host.assign(Plan(spec, "balanced", (Stage("me", 0, 6),), (), 0.0, "p1"), (0, 6))
        first = host.runner

        def fill():
            first.forward("r", mx.array([TURNS[0]]), 0)
            first.release("r", keep=TURNS[0])
        await worker.run(fill)
        assert first.prompt_stats().entries == 1
        await host.assign(Plan(spec, "balanced", (Stage("me", 0, 6),), (), 0.0, "p2"), (0, 6))
        assert host.runner is first and first.prompt_stats().entries == 1  # same layers: kept
        await host.assign(Plan(spec, "balanced", (Stage("me", 0, 3), Stage("you", 3, 6)), (), 0.0, "p3"), (0, 3))
        assert host.runner is not first and host.runner.prompt_stats().entries == 0
    asyncio.run(run())


def test_the_budget_is_what_the_plan_leaves_or_a_fixed_size():
    from swarm.cli import build_parser, config_from_args
    from swarm.engine.model_bytes import LayerCache

    layers = [LayerCache(per_token=1000, fixed=0)] * 4
    auto = PromptCacheSize(None, offered=50_000_000, most=512 << 20, reserve_tokens=4096)
    assert auto.for_layers(30_000_000, layers) == 50_000_000 - 30_000_000 - 4 * 4096 * 1000
    assert auto.for_layers(48_000_000, layers) == 0  # a tight node keeps nothing, and plans as before
    assert PromptCacheSize(None, 10 << 30, 512 << 20, 4096).for_layers(1 << 30, layers) == 512 << 20
    assert PromptCacheSize(64 << 20).for_layers(1 << 40, layers) == 64 << 20
    parse = build_parser().parse_args
    assert config_from_args(parse(["--prompt-cache", "256M"])).prompt_cache == 256 << 20
    assert config_from_args(parse(["--prompt-cache", "0"])).prompt_cache == 0
    assert config_from_args(parse(["--prompt-cache", "auto"])).prompt_cache is None
    assert config_from_args(parse([])).prompt_cache is None
