"""Speculative decoding through real stages in one process (entry/speculation.py, engine/draft_check.py):
greedy tokens equal mlx-lm's and the tokens without drafts, whatever the drafts, through 1-, 2- and 3-way
splits; a seeded sampled request draws the same tokens; every stage's caches end at the accepted length."""

from __future__ import annotations

import asyncio

import pytest

from swarm.engine.decoding_rules import DecodingRules
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.engine.worker import MlxWorker
from swarm.entry.generate import GenerationJob, generate_tokens
from swarm.entry.speculation import PromptLookup, Speculation, SpeculationCounts, word_start_tokens
from local_pipeline import LocalPipeline, Stages, ranges
from helpers import TINY_FAMILIES, TINY_SHAPE
from reference import reference_tokens

GREEDY = SamplingParams(temperature=0.0)
SPLITS = [[6], [1, 5], [2, 3, 1]]
PROMPT = [3, 17, 42, 5, 99, 23, 7, 64, 12, 3, 17, 42]
N = 24


def oracle(expected: list[int], prompt_len: int, wrong: bool = False):
    """Drafts that are the reference's own next tokens (all accepted), or each off by one (all rejected)."""
    def source(history: list[int], k: int) -> list[int]:
        done = len(history) - prompt_len
        drafts = expected[done:done + k]
        return [(t + 1) % 50 for t in drafts] if wrong else drafts
    return source


@pytest.fixture(scope="module")
def expected(llama):
    tokens = [t for t, _ in reference_tokens(llama, PROMPT, N)]
    assert len(set(tokens)) > 3, "the test model must not collapse into one token"
    return tokens


@pytest.mark.parametrize("sizes", SPLITS, ids=lambda s: "-".join(map(str, s)))
def test_greedy_tokens_equal_mlx_lm_with_any_drafts(llama, expected, sizes):
    stages = Stages(llama, sizes)
    try:
        assert stages.run(PROMPT, N) == expected, "without drafts"
        for name, source in [("lookup", None), ("all accepted", oracle(expected, len(PROMPT))),
                             ("all rejected", oracle(expected, len(PROMPT), wrong=True))]:
            counts = SpeculationCounts()
            assert stages.run(PROMPT, N, speculation=Speculation(counts, source)) == expected, name
            if name == "all accepted":
                assert counts.accepted == counts.proposed > N // 2, counts
            if name == "all rejected":
                assert counts.proposed > 0 and counts.accepted == 0, counts
    finally:
        stages.close()


def test_drafts_past_max_tokens_and_eos_are_cut(llama, expected):
    stages = Stages(llama, [2, 4])
    try:
        counts = SpeculationCounts()
        assert stages.run(PROMPT, 7, speculation=Speculation(counts, oracle(expected, len(PROMPT)))) == expected[:7]
        assert counts.steps and counts.proposed <= 6, "no draft asks past max_tokens"

        eos = expected[9]

        async def pipe(_b=None):
            return stages.pipeline

        async def go():
            ahead = expected + [1] * 20  # (drafts of 8, past the EOS)
            job = GenerationJob("r2", PROMPT, GREEDY, N, eos_ids=frozenset({eos}),
                                speculation=Speculation(source=lambda h, k: ahead[len(h) - len(PROMPT):][:8]))
            return [t async for t in generate_tokens(job, pipe)]
        got = asyncio.run(go())
        assert got == expected[:expected.index(eos) + 1], "an accepted EOS ends the answer there"
    finally:
        stages.close()


def test_seeded_sampling_and_logprobs_are_the_same_with_drafts(llama):
    sampling = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, seed=77)
    rules = DecodingRules(prompt_len=len(PROMPT), logprobs=3)
    stages = Stages(llama, [3, 3])
    try:
        jobs: list = []  # (each run's job: its logprobs)
        plain = stages.run(PROMPT, N, sampling, rules=rules, job_out=jobs)
        counts = SpeculationCounts()
        drafted = stages.run(PROMPT, N, sampling, rules=rules, job_out=jobs,
                             speculation=Speculation(counts, oracle(plain, len(PROMPT))))
        assert drafted == plain
        assert counts.accepted > N // 2, counts
        assert len(jobs[1].logprobs) == len(jobs[0].logprobs) == N
        for a, b in zip(jobs[0].logprobs, jobs[1].logprobs):
            assert a.ids.tolist() == b.ids.tolist()
            assert abs(a.logprobs - b.logprobs).max() < 1e-4
    finally:
        stages.close()


def test_prompt_lookup_proposes_what_followed_the_latest_occurrence_as_far_as_the_earlier_ones_agree():
    assert PromptLookup().drafts([1, 2, 3, 4, 5, 1, 2], 3) == [3, 4, 5]
    assert PromptLookup().drafts([1, 2, 3, 4, 5, 7, 2, 3, 4, 6, 2, 3], 3) == [4], \
        "[2, 3] was followed by 4, 5 and by 4, 6: the latest's as far as they agree"
    assert PromptLookup().drafts([1, 2, 3, 4, 5, 1, 2, 3, 9, 2, 3], 2) == [], \
        "[2, 3] was followed by 4 and by 9 (a list's next number): a guess would be chance"
    assert PromptLookup().drafts([1, 2, 3, 4, 5, 1, 2, 3, 9, 2, 3, 7], 2) == []


def test_prompt_lookup_reads_a_quote_in_order():
    """Once guesses came from a place, the next come from the nearest occurrence after it, not the latest (of a
    run of two tokens or more: a lone token is mostly chance)."""
    text = [10, 11, 12, 13, 14, 20, 12, 15, 16, 17, 20, 12, 18]  # [20, 12] twice, 12 three times
    lookup = PromptLookup()
    history = text + [10]
    assert lookup.drafts(history, 2) == [11, 12]
    history += [11, 12]  # accepted
    assert lookup.drafts(history, 3) == [13, 14, 20], "the quote goes on"
    history += [13, 14, 20, 12]
    assert lookup.drafts(history, 2) == [15, 16], "the [20, 12] nearest after the quote, not the latest"
    assert PromptLookup().drafts(text + [20, 12], 1) == [], \
        "without a quote under way, [20, 12] was followed by 15 and by 18: no guess"
    history += [99, 12]
    assert lookup.drafts(history, 1) == [], "a lone 12, followed by 13, 15, 18 and 99: no guess, not even the near 13"


def test_prompt_lookup_takes_up_a_quote_after_a_changed_word():
    """The answer fixes a word (its own tokens, never seen): the guesses go on from the quote's next word; a
    changed token that begins no word (a digit) skips as many tokens of the quote."""
    W = frozenset({20, 21, 22, 23, 24, 30})  # tokens that begin a word
    text = [20, 1, 2, 21, 22, 5, 6, 23, 24]  # "20 1 2" is a misspelled word of three tokens
    lookup = PromptLookup(word_starts=W)
    history = text + [9, 20]
    assert lookup.drafts(history, 3) == [1, 2, 21]
    history += [30]  # the fixed word: one token of its own in place of [1, 2]
    assert lookup.drafts(history, 3) == [21, 22, 5], "the quote's next word"
    history += [21, 22, 5, 7]  # 7 in place of 6: not a word start, so one token on
    assert lookup.drafts(history, 2) == [23, 24]
    assert PromptLookup().drafts(text + [9, 20, 30], 3) == [], "without word starts nothing to take up"
    assert word_start_tokens({"Ġthe": 1, "the": 2, "Ċ": 3, "▁a": 4, ".": 5}) == {1, 3, 4}


def test_the_prompt_cache_is_reused_after_a_speculative_turn(llama, expected):
    """Turn 1 ends on a step whose drafts were rejected (its caches hold their positions): the stages keep
    only what the answer holds, and turn 2 starts from it and gives mlx-lm's tokens."""
    from swarm.entry.prompt_index import PromptIndex
    worker = MlxWorker()
    try:
        runners = [ShardRunner(worker.run_sync(load_shard, llama, a, b), prompt_cache_bytes=32 << 20)
                   for a, b in ranges([2, 4])]
        pipeline = LocalPipeline(runners, worker, PromptIndex())

        async def pipe(_broken=None):
            return pipeline

        async def turn(rid, prompt, n, speculation, eos=frozenset()):
            job = GenerationJob(rid, prompt, GREEDY, n, eos, speculation=speculation)
            return [t async for t in generate_tokens(job, pipe)]
        counts = SpeculationCounts()
        end = next(i for i in range(8, N) if expected[i] not in expected[:i])  # ends on a step with drafts

        def past_the_end(history, k):  # right up to the end, then a wrong one: the last step's is rejected
            done = len(history) - len(PROMPT)
            return (expected[done:end] + [(expected[end] + 1) % 50])[:k]
        first = asyncio.run(turn("t1", PROMPT, N, Speculation(counts, past_the_end), frozenset({expected[end]})))
        assert first == expected[:end + 1] and counts.proposed > counts.accepted > 0
        second_prompt = PROMPT + first + [9, 8, 7, 6]
        want = [t for t, _ in reference_tokens(llama, second_prompt, 10)]
        got = asyncio.run(turn("t2", second_prompt, 10, Speculation(source=oracle(want, len(second_prompt)))))
        assert got == want
        assert all(r.prompt_stats().hits == 1 for r in runners), [r.prompt_stats() for r in runners]
    finally:
        worker.close()


def test_drafting_pauses_where_it_does_not_pay_and_lets_those_steps_run_ahead():
    from swarm.entry import speculation as sp

    def next_drafts(spec, *args, **kwargs):
        return asyncio.run(spec.next_drafts(*args, **kwargs))
    never = Speculation(source=lambda h, k: [])
    drafts, ahead = [], []
    for i in range(40):
        drafts.append(next_drafts(never, [1, 2, 3], 10, crowded=False))
        ahead.append(never.may_run_ahead(crowded=False))
    assert not any(drafts)
    assert ahead[:sp.MISSES - 1] == [False] * (sp.MISSES - 1) and all(ahead[sp.MISSES - 1:sp.MISSES + 7]), \
        "after MISSES steps without drafts it pauses, and its steps run ahead"
    always = Speculation(source=lambda h, k: [5] * k)
    assert next_drafts(always, [1], 10, crowded=True) == [] and always.may_run_ahead(crowded=True)
    assert next_drafts(always, [1], 10, crowded=False) == [], "the step after one run ahead carries no drafts"
    always.may_run_ahead(crowded=False)
    assert next_drafts(always, [1], 2, crowded=False) == [5, 5], "never more than the room left"
    always.checked(2, 2)
    assert always.k == sp.START_DRAFTS + 2
    always.checked(6, 0)
    assert always.k == (sp.START_DRAFTS + 2) // 2


def test_a_quote_that_begins_in_a_pause_is_drafted_within_a_few_steps():
    """A pause (drafting did not pay) lets steps run ahead, but every PEEK_EVERY-th step waits for its token and
    looks for a quote: the last QUOTE tokens found together earlier. Once one is found the pause ends."""
    from swarm.entry import speculation as sp
    from swarm.entry.speculation import request_speculation

    quoted = list(range(100, 140))  # the prompt: a text the answer will quote
    history = quoted + [1]
    spec = request_speculation("lookup", SpeculationCounts())

    def step() -> tuple[list[int], bool]:
        drafts = asyncio.run(spec.next_drafts(history, 50, crowded=False))
        return drafts, spec.may_run_ahead(crowded=False)
    pause = []
    for token in range(200, 200 + sp.MISSES + 2):  # the answer's own tokens, never seen: no drafts, then a pause
        pause.append(step())
        history.append(token)
    assert not any(drafts for drafts, _ in pause) and any(ahead for _, ahead in pause), "paused, running ahead"
    for i, token in enumerate(quoted):  # the answer quotes the prompt
        history.append(token)
        drafts, _ = step()
        if drafts:
            break
    assert drafts == quoted[i + 1:i + 1 + len(drafts)], "the quote's next tokens"
    assert i + 1 <= sp.QUOTE + sp.PEEK_EVERY, "found within a few steps of the quote's start"


def test_a_pipeline_broken_mid_draft_replays_the_accepted_history_only(llama, expected):
    """The stage holding the drafts dies while a step with drafts is out: the request replays on new stages
    what was accepted, and its tokens are mlx-lm's."""
    from swarm.entry.pipeline import PipelineBroken
    worker = MlxWorker()
    try:
        broke = []

        class Breaking(LocalPipeline):
            async def forward(self, request_id, tokens, start_pos, sampling, *args, drafts=None, **kwargs):
                if drafts and not broke and start_pos > len(PROMPT) + 4:
                    out = await super().forward(request_id, tokens, start_pos, sampling, *args, drafts=drafts,
                                                **kwargs)  # (the stages computed it; its answer is lost)
                    broke.append((start_pos, out))
                    raise PipelineBroken("stage killed")
                return await super().forward(request_id, tokens, start_pos, sampling, *args, drafts=drafts, **kwargs)
        first = Breaking([ShardRunner(worker.run_sync(load_shard, llama, a, b)) for a, b in ranges([3, 3])], worker)
        fresh = LocalPipeline([ShardRunner(worker.run_sync(load_shard, llama, a, b)) for a, b in ranges([1, 5])],
                              worker)
        pipes = [first, fresh]

        async def pipe(broken=None):
            return pipes[1] if broken is not None else pipes[0]

        async def go():
            job = GenerationJob("r", PROMPT, GREEDY, N, speculation=Speculation(
                source=lambda h, k: (expected + [1] * 20)[len(h) - len(PROMPT):][:k]))
            return [t async for t in generate_tokens(job, pipe)], job
        tokens, job = asyncio.run(go())
        assert broke and job.attempt == 1 and tokens == expected
    finally:
        worker.close()


@pytest.mark.parametrize("family", [*TINY_FAMILIES, "gemma2", "phi3", "gemma3_text", "mamba"])
def test_zoo_families_give_mlx_lm_tokens_with_drafts_or_draft_nothing(random_model, family):
    """A family whose caches can drop positions gives mlx-lm's greedy tokens through a split whatever the drafts;
    one whose caches cannot (a sliding window, a recurrent state) is known so at start (ModelBytes), and a
    node serving it drafts nothing."""
    from swarm.engine.model_bytes import measure_model_bytes
    from swarm.entry.speculation import speculation_mode
    model_dir = random_model(family, **TINY_SHAPE)
    if not measure_model_bytes(model_dir, None).checks_drafts:
        assert family in ("gemma3_text", "mamba") and speculation_mode("auto", False) == "off"
        return
    want = [t for t, _ in reference_tokens(model_dir, PROMPT, 16)]
    stages = Stages(model_dir, [2, 4])
    try:
        for wrong in (False, True):
            counts = SpeculationCounts()
            assert stages.run(PROMPT, 16, speculation=Speculation(counts, oracle(want, len(PROMPT), wrong))) == want
            assert counts.proposed > 0
    finally:
        stages.close()


def test_accepting_drafts_while_they_match_keeps_the_target_distribution():
    """The sampling rule on a small vocabulary, a fixed set of seeds: what a checked step emits is, seed by
    seed, what steps of one position draw, so the first token follows the target's distribution whatever
    the drafts, and the token after an accepted draft follows the next position's."""
    import math

    import mlx.core as mx

    from swarm.engine.draft_check import DraftCheck
    from swarm.engine.sampling import sampled

    rows = mx.array([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 1.5, 0.2, 1.0, 0.3], [1.0, 1.0, 1.0, 1.0, 1.0]])
    target = [mx.softmax(rows[i]).tolist() for i in range(2)]
    seeds, pos = range(3000), 40
    for drafts in ([0, 1], [4, 4], [1, 3]):
        first, second = [0] * 5, [0] * 5
        for seed in seeds:
            sampling = SamplingParams(temperature=1.0, seed=seed)
            check = DraftCheck(rows, drafts, sampling, pos)
            mx.eval(check.arrays())
            accepted, token = check.result()[:2]
            emitted = drafts[:accepted] + [token]
            alone = [sampled(rows[i], sampling, pos + i + 1).item() for i in range(len(emitted))]
            assert emitted == alone, (seed, drafts, emitted, alone)
            first[emitted[0]] += 1
            if accepted:
                second[emitted[1]] += 1
        # chi-square against the target with 4 degrees of freedom: 18.5 is its 0.999 quantile
        n = len(seeds)
        chi = sum((first[v] - n * p) ** 2 / (n * p) for v, p in enumerate(target[0]))
        assert chi < 18.5, (drafts, first, target[0])
        after = sum(second)
        if after >= 200:
            chi = sum((second[v] - after * p) ** 2 / (after * p) for v, p in enumerate(target[1]))
            assert chi < 18.5, (drafts, second, target[1])
        assert math.isclose(first[drafts[0]] / n, target[0][drafts[0]], abs_tol=0.04), "acceptance of draft 1"
