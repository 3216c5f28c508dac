"""A prompt no other request of its entry waits behind goes through in large chunks, and in small ones
as soon as another request runs (entry/prompt_chunks.py): the rule itself, the chunks a real
generation loop sends alone and when a second request arrives mid-prompt, the greedy tokens equal
mlx-lm's at the large chunk whole and split 3 ways, and a real node's chunk counter (/health)."""

from __future__ import annotations

import asyncio
import math
import threading

from swarm.backend import CPU_PREFILL_CHUNK, CPU_PREFILL_CHUNK_ALONE, GPU_PREFILL_CHUNK, GPU_PREFILL_CHUNK_ALONE
from swarm.engine.sampling import SamplingParams
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.engine.worker import MlxWorker
from swarm.entry.generate import GenerationJob, default_prefill_alone, default_prefill_step, generate_tokens
from swarm.entry.prompt_chunks import next_chunk
from helpers import openai_client
from local_pipeline import LocalPipeline, ranges
from reference import PREFILL_STEP, reference_tokens

GREEDY = SamplingParams(temperature=0.0)
SMALL, LARGE = default_prefill_step(), default_prefill_alone()


def test_the_rule_large_alone_small_beside_never_past_the_prompt():
    assert next_chunk(1000, 16, 128, is_alone=True) == 128
    assert next_chunk(1000, 16, 128, is_alone=False) == 16
    assert next_chunk(40, 16, 128, is_alone=True) == 40  # a new turn goes in one pass
    assert next_chunk(5, 16, 128, is_alone=False) == 5
    assert next_chunk(128, 16, 128, is_alone=False) == 128  # what is left fits one large chunk: one pass
    assert next_chunk(129, 16, 128, is_alone=False) == 16
    assert next_chunk(0, 16, 128, is_alone=True) == 0
    assert next_chunk(1000, 256, 128, is_alone=True) == 256  # never smaller than the chunk beside others
    # the sizes per backend: alone larger; on a GPU mlx-lm's prefill_step_size
    assert CPU_PREFILL_CHUNK < CPU_PREFILL_CHUNK_ALONE <= GPU_PREFILL_CHUNK_ALONE == 2048
    assert GPU_PREFILL_CHUNK < GPU_PREFILL_CHUNK_ALONE
    assert (SMALL, LARGE, PREFILL_STEP) == (CPU_PREFILL_CHUNK, CPU_PREFILL_CHUNK_ALONE, CPU_PREFILL_CHUNK_ALONE)


class Recording(LocalPipeline):
    """Notes each prompt chunk's (request, positions) as it is answered."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunks: list[tuple[str, int]] = []
        self.answered = asyncio.Event()

    async def forward(self, request_id, tokens, start_pos, sampling, *args, **kwargs):
        out = await super().forward(request_id, tokens, start_pos, sampling, *args, **kwargs)
        if sampling is None:
            self.chunks.append((request_id, len(tokens)))
            self.answered.set()
        return out


def _prompt(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + 31 * i) % 370 + 3 for i in range(n)]  # (the tiny tokenizer's ids)


def _run(model_dir, sizes: list[int], jobs, arrive_after: int | None = None):
    """Runs jobs[0]; with `arrive_after`, jobs[1] starts once jobs[0]'s chunk number `arrive_after` was
    answered. Returns ({request: tokens}, the chunks in order)."""
    worker = MlxWorker()
    try:
        stages = [ShardRunner(worker.run_sync(load_shard, model_dir, a, b)) for a, b in ranges(sizes)]
        pipeline = Recording(stages, worker)

        async def pipe(_broken=None):
            return pipeline

        async def collect(job):
            return job.request_id, [t async for t in generate_tokens(job, pipe)]

        async def main():
            first = asyncio.create_task(collect(jobs[0]))
            tasks = [first]
            if arrive_after is not None:
                while len(pipeline.chunks) < arrive_after:
                    pipeline.answered.clear()
                    await pipeline.answered.wait()
                tasks.append(asyncio.create_task(collect(jobs[1])))
            return dict(await asyncio.gather(*tasks))

        return asyncio.run(main()), pipeline.chunks
    finally:
        worker.close()


def test_alone_large_chunks_equal_mlx_lm_at_that_step_then_small_ones_when_a_second_request_arrives(llama):
    """Alone: chunks of LARGE (the last shorter), and the tokens mlx-lm's generate_step gives at
    prefill_step_size=LARGE, whole and split 3 ways. A second request that starts after the first
    prompt's second chunk: the first prompt's next chunks are SMALL while it runs."""
    n = 2 * LARGE + 45
    prompt = _prompt(n, 1)
    expected = [t for t, _ in reference_tokens(llama, prompt, 4, prefill_step=LARGE)]
    assert len(set(expected)) > 1
    for sizes in ([6], [2, 3, 1]):
        tokens, chunks = _run(llama, sizes, [GenerationJob("r1", prompt, GREEDY, 4)])
        assert chunks == [("r1", LARGE), ("r1", LARGE), ("r1", 44)], sizes
        assert tokens["r1"] == expected, sizes
    long_job = GenerationJob("long", _prompt(6 * LARGE, 2), GREEDY, 1)
    short_job = GenerationJob("short", _prompt(LARGE + 2 * SMALL + 1, 3), GREEDY, 3)
    _, chunks = _run(llama, [6], [long_job, short_job], arrive_after=2)
    longs = [size for rid, size in chunks if rid == "long"]
    assert longs[:2] == [LARGE, LARGE], chunks
    at = [k for k, (rid, _) in enumerate(chunks) if rid == "short"]
    # (the chunk the first prompt chose before the second one's first frame left is large)
    while_short_ran = [size for rid, size in chunks[at[0]:at[-1]] if rid == "long"]
    assert while_short_ran and all(size == SMALL for size in while_short_ran), chunks
    assert sum(longs) == 6 * LARGE - 1 and long_job.prompt_chunks == len(longs)
    # beside the first prompt: small chunks until what is left fits a large one
    assert [size for rid, size in chunks if rid == "short"] == [SMALL, SMALL, LARGE], chunks


def _beside(remaining: int) -> int:
    """Chunks of a prompt read beside another request throughout: small ones until what is left fits a
    large one."""
    n = 0
    while remaining > LARGE:
        remaining, n = remaining - SMALL, n + 1
    return n + (remaining > 0)


def _chunks(node) -> int:
    return node.health()[1]["prompt_chunks"]


def test_a_real_node_reads_a_prompt_alone_in_large_chunks_and_beside_a_decoding_request_in_small_ones(node, llama):
    """/health's prompt_chunks: a prompt alone goes in ceil((n - 1) / LARGE) chunks; one of the same
    length sent while another request decodes in more (ceil((n - 1) / SMALL) if that one decodes until
    it is answered: on the tiny model a few thousand steps may end sooner)."""
    client = openai_client(node.url)
    text = " ".join(f"w{i % 97}" for i in range(300))
    before = _chunks(node)
    alone = client.completions.create(model="llama", prompt=text, max_tokens=1, temperature=0)
    n = alone.usage.prompt_tokens
    assert n > 2 * LARGE, n
    assert _chunks(node) - before == math.ceil((n - 1) / LARGE)

    from mlx_lm.utils import load_tokenizer
    eos = load_tokenizer(llama).eos_token_ids
    decoding = client.completions.create(model="llama", prompt="hello", max_tokens=3000, temperature=0, stream=True,
                                         logit_bias={str(t): -100 for t in eos})
    first = next(iter(decoding))  # its prompt was read: it decodes now
    assert first.choices
    done = threading.Event()

    def drain() -> None:
        for _ in decoding:
            pass
        done.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    before = _chunks(node)
    beside = client.completions.create(model="llama", prompt=text.replace("w1", "v1"), max_tokens=1, temperature=0)
    after = _chunks(node)
    still_decoding = not done.is_set()
    decoding.close()
    reader.join(60)
    m = beside.usage.prompt_tokens
    assert m > 2 * LARGE, m
    # It arrived while the other request decoded: at least its first chunk is small (more chunks than
    # alone); if that request still decoded when it was answered, all of them were.
    assert after - before > math.ceil((m - 1) / LARGE), (m, after - before)
    if still_decoding:
        assert after - before == _beside(m - 1), (m, after - before)
