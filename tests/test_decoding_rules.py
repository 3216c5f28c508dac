"""Decoding rules on the last stage (engine/request_sampler.py), in one process against mlx-lm.

Grammars, logit bias, penalties and logprobs give what an independent reference
computes from the whole model, and a request's sampler rebuilt on brand-new stages
from the replayed history (what churn does) continues exactly as it would have.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from local_pipeline import LocalPipeline
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model, load_tokenizer
from reference import reference_with_penalties

from swarm.engine.constraints import GrammarVocab
from swarm.engine.decoding_rules import DecodingRules
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.engine.worker import MlxWorker
from swarm.entry.generate import ECHO_PREFILL_STEP, GenerationJob, generate_tokens
from swarm.entry.grammars import json_schema_grammar
from swarm.entry.pipeline import PipelineBroken

GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=77)
PROMPT = [3, 17, 42, 5, 99, 23, 7, 64, 12]
BOUNDED = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
           "properties": {"name": {"type": "string", "maxLength": 12},
                          "age": {"type": "integer", "minimum": 0, "maximum": 120},
                          "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 5}}}}


@pytest.fixture(scope="module")
def worker():
    w = MlxWorker()
    yield w
    w.close()


def stages(model_dir, worker, sizes=(3, 3)) -> list[ShardRunner]:
    vocab = GrammarVocab(load_tokenizer(model_dir))
    bounds = np.cumsum([0, *sizes])
    return [ShardRunner(worker.run_sync(load_shard, model_dir, int(a), int(b)), vocab=vocab)
            for a, b in zip(bounds, bounds[1:])]


class BreakingPipeline(LocalPipeline):
    """Breaks (as a dead stage does) at its `after`-th sampled step."""

    def __init__(self, stages, worker, after: int):
        super().__init__(stages, worker)
        self.after, self.sampled = after, 0

    async def forward(self, request_id, tokens, start_pos, sampling, continue_unless=None, rules=None, prefix=None,
                      attempt=0):
        if sampling is not None:
            self.sampled += 1
            if self.sampled == self.after:
                raise PipelineBroken("stage killed")
        return await super().forward(request_id, tokens, start_pos, sampling, continue_unless, rules, prefix)


def run(model_dir, worker, rules, sampling=GREEDY, n=24, prompt=PROMPT, break_after: int | None = None):
    """Generate; with break_after, the pipeline breaks then and the rest runs on brand-new stages."""
    first = stages(model_dir, worker)
    pipes = [BreakingPipeline(first, worker, break_after) if break_after else LocalPipeline(first, worker)]

    async def source(broken=None):
        if broken is not None:  # a new pipeline: new shards, so a new last stage with no state at all
            pipes.append(LocalPipeline(stages(model_dir, worker, (2, 4)), worker))
        return pipes[-1]

    async def go():
        job = GenerationJob("r1", prompt, sampling, n, rules=rules)
        return [t async for t in generate_tokens(job, source)], job

    tokens, job = asyncio.run(go())
    assert len(pipes) == (2 if break_after else 1)
    return tokens, job


def grammar_rules(**more) -> DecodingRules:
    return DecodingRules(prompt_len=len(PROMPT), grammar=json_schema_grammar(BOUNDED), **more)


def text(model_dir, tokens: list[int]) -> str:
    return load_tokenizer(model_dir).decode([t for t in tokens if t != 2])


def test_grammar_output_follows_the_schema_even_from_a_random_model(llama, worker):
    for seed in range(3):
        tokens, _ = run(llama, worker, grammar_rules(), SamplingParams(temperature=1.0, seed=seed), n=200)
        assert tokens[-1] == 2, "a bounded schema ends, then only EOS is allowed"
        jsonschema.validate(json.loads(text(llama, tokens)), BOUNDED)


def test_logprobs_are_the_models_own_log_softmax(llama, worker):
    tokens, job = run(llama, worker, DecodingRules(prompt_len=len(PROMPT), logprobs=5))
    model, _ = load_model(llama)
    expected = [(int(t), np.array(lp)) for (t, lp), _ in zip(generate_step(mx.array(PROMPT), model), range(24))]
    assert tokens == [t for t, _ in expected]
    assert len(job.logprobs) == len(tokens)
    for (token, lp), row in zip(expected, job.logprobs):
        assert row.ids[0, 0] == token
        np.testing.assert_allclose(row.logprobs[0, 0], lp[token], atol=1e-5)
        best = np.argsort(-lp, kind="stable")[:5]
        assert row.ids[0, 1:].tolist() == best.tolist()
        np.testing.assert_allclose(row.logprobs[0, 1:], lp[best], atol=1e-5)


def test_echo_scores_every_prompt_token_across_prefill_chunks(llama, worker):
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 380, ECHO_PREFILL_STEP * 2 + 7)]
    _, job = run(llama, worker, DecodingRules(prompt_len=len(prompt), logprobs=2, echo_logprobs=True), n=2,
                 prompt=prompt)
    model, _ = load_model(llama)
    logits = model(mx.array(prompt)[None])[0].astype(mx.float32)
    lp = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
    rows = job.prompt_logprobs
    assert rows.ids[:, 0].tolist() == prompt[1:]
    np.testing.assert_allclose(rows.logprobs[:, 0], lp[np.arange(len(prompt) - 1), prompt[1:]], atol=1e-4)
    np.testing.assert_allclose(rows.logprobs[:, 1], lp[:-1].max(axis=-1), atol=1e-4)


@pytest.mark.parametrize("presence,frequency", [(1.5, 0.0), (0.0, 1.0), (0.5, 0.5)])
def test_penalties_and_bias_are_openais(llama, worker, presence, frequency):
    # The prompt holds the tokens the model likes next: penalizing the prompt too would show.
    prompt = PROMPT + run(llama, worker, None)[0][:8]
    plain, _ = run(llama, worker, None, prompt=prompt)
    bias = {plain[0]: -100.0, 200: 3.0}
    rules = DecodingRules(prompt_len=len(prompt), logit_bias=tuple(sorted(bias.items())),
                          presence_penalty=presence, frequency_penalty=frequency)
    got, _ = run(llama, worker, rules, prompt=prompt)
    assert got == reference_with_penalties(llama, prompt, 24, bias, presence, frequency)
    assert got != plain and plain[0] not in got


def test_repetition_penalty_counts_the_prompt_too(llama, worker):
    plain, _ = run(llama, worker, None)
    got, _ = run(llama, worker, DecodingRules(prompt_len=len(PROMPT), repetition_penalty=10.0))
    assert got != plain
    assert not set(got) & set(PROMPT), "a 10x repetition penalty keeps the prompt's tokens out (this model)"


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_new_last_stage_rebuilds_the_sampler_from_the_replayed_history(llama, worker, sampling):
    rules = grammar_rules(logprobs=3, presence_penalty=0.3, frequency_penalty=0.2, logit_bias=((7, 2.0),))
    undisturbed, calm = run(llama, worker, rules, sampling, n=120)
    assert len(undisturbed) > 12
    replayed, job = run(llama, worker, rules, sampling, n=120, break_after=9)
    assert replayed == undisturbed
    jsonschema.validate(json.loads(text(llama, replayed)), BOUNDED)
    for a, b in zip(calm.logprobs, job.logprobs, strict=True):
        assert a.ids.tolist() == b.ids.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_batched_rows_keep_their_own_rules(llama, worker):
    """ShardRunner.decode_batch samples each row with its own request's sampler."""
    def steps(batched: bool) -> dict[str, list[int]]:
        [runner] = stages(llama, worker, (6,))
        rules = {"g": grammar_rules(), "b": DecodingRules(prompt_len=len(PROMPT), logit_bias=((9, 50.0),)),
                 "p": None}
        out = {}
        for rid, r in rules.items():
            out[rid] = [worker.run_sync(runner.forward, rid, mx.array([PROMPT]), 0, GREEDY, "", r,
                                        PROMPT if r else None)]
        for _ in range(8):
            pos = len(PROMPT) + len(out["g"]) - 1
            items = [(rid, mx.array([[out[rid][-1]]]), pos, GREEDY, [out[rid][-1]] if rules[rid] else None)
                     for rid in rules]
            if batched:
                results = worker.run_sync(runner.decode_batch, items)
            else:
                results = [worker.run_sync(runner.forward, *item[:4], "", None, item[4]) for item in items]
            for (rid, *_), token in zip(items, results):
                out[rid].append(token)
        return out

    one_by_one, batched = steps(False), steps(True)
    assert batched == one_by_one
    assert set(batched["b"]) == {9}, "a +50 bias wins every step"
    assert text(llama, batched["g"]).startswith('{"name": "')
