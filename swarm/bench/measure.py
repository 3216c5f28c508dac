"""Timed runs of one setup: mlx-lm alone in this process, or a local swarm over HTTP.

Same rules everywhere: greedy, the same prompts, a fixed max_tokens, a short warm-up
first, single-stream numbers are the median of `runs`. Every timed request sends a
copy of the prompt of its own (ColdPrompts), so a swarm's prompt cache holds none of
it: the time to first token is a cold prompt's. The warm figure repeats the first
copy on purpose. Aggregate tokens/s counts every generated token over the wall time
of all streams, prefill included.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from ..engine.model_bytes import loaded_bytes
from ..entry.prefill_chunks import PrefillChunks
from .client import StreamRun, concurrent_completions, stream_completion
from .cluster import LocalCluster, get_json
from .results import SetupResult

WARMUP_TOKENS = 4


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


@dataclass(frozen=True)
class Expected:
    """What every greedy stream must give: mlx-lm's token ids (EOS left out), compared with the ids a node
    streams; its text only for a node that gives no ids (a build before return_token_ids)."""
    ids: tuple[int, ...]
    text: str
    eos: frozenset[int] = frozenset()

    def matches(self, run: StreamRun) -> bool:
        if run.token_ids is not None:
            return tuple(t for t in run.token_ids if t not in self.eos) == self.ids
        return run.text == self.text


@dataclass
class ColdPrompts:
    """Copies of one prompt (prompts.cold), each with mlx-lm's answer to it: copy k is sent by the
    k-th timed request of a setup (singles first, then the concurrent rounds), so none is warm."""
    kind: str  # its name in prompts.PROMPTS
    texts: list[str]
    expected: list[Expected]  # filled by MlxLmAlone.measure

    def single(self, i: int) -> tuple[str, Expected]:
        return self.texts[i], self.expected[i]


def _same(streamed: list[tuple[StreamRun, Expected]]) -> str:
    """"yes", or how many differ (ids by text: "by text")."""
    bad = sum(not expected.matches(run) for run, expected in streamed)
    how = "" if all(run.token_ids is not None for run, _ in streamed) else ", by text"
    return ("yes" if not bad else f"no ({bad}/{len(streamed)} differ)") + how


class MlxLmAlone:
    """mlx-lm on the full model in this process: stream_generate for one stream, batch_generate for more."""

    def __init__(self, model_path, cast_float32: bool = False, dtype: mx.Dtype | None = None):
        """`dtype`: cast floating weights to it, as a node does for its --dtype (Backend.weights_dtype);
        `cast_float32`: the same as float32 (what a node on a CPU backend does for --dtype auto)."""
        from mlx_lm.utils import load
        self.model, self.tokenizer = load(str(model_path))
        dtype = dtype or (mx.float32 if cast_float32 else None)
        if dtype is not None:
            self.model.apply(lambda x: x.astype(dtype) if mx.issubdtype(x.dtype, mx.floating) else x)
            mx.eval(self.model.parameters())

    def close(self) -> None:
        del self.model
        gc.collect()

    def generate(self, prompt: list[int], max_tokens: int) -> tuple[list[int], float, float, float]:
        """(token ids, ttft s, first->last token s, wall s)."""
        from mlx_lm.generate import stream_generate
        ids, times = [], []
        t0 = time.perf_counter()
        # read in the chunks a node of this backend reads a prompt alone in (prefill_chunks.py): the same floats
        for r in stream_generate(self.model, self.tokenizer, prompt, max_tokens=max_tokens,
                                 prefill_step_size=PrefillChunks.of_backend().alone):
            ids.append(r.token)
            times.append(time.perf_counter())
        # stream_generate yields the EOS token too; the swarm does not count it as text
        return ids, times[0] - t0, times[-1] - times[0], time.perf_counter() - t0

    def batch(self, prompt: list[int], max_tokens: int, n: int) -> tuple[int, float]:
        from mlx_lm.generate import batch_generate
        t0 = time.perf_counter()
        out = batch_generate(self.model, self.tokenizer, [prompt] * n, max_tokens=max_tokens,
                             return_token_ids=True)
        return sum(len(t) for t in out.token_ids), time.perf_counter() - t0

    def weight_bytes(self) -> int:
        return loaded_bytes(self.model)

    def batch_tps(self, prompt: list[int], max_tokens: int, n: int) -> float:
        tokens, wall = self.batch(prompt, max_tokens, n)
        return tokens / wall

    def measure(self, prompts: ColdPrompts, max_tokens: int, concurrency: list[int],
                runs: int) -> SetupResult:
        """Single streams on the first `runs` copies (timed), then each copy's answer (the expected ids of
        every copy, untimed beyond those), then batches of the first copy."""
        encode = self.tokenizer.encode
        eos = frozenset(self.tokenizer.eos_token_ids)
        self.generate(encode(prompts.texts[-1]), WARMUP_TOKENS)
        singles = [self.generate(encode(text), max_tokens) for text in prompts.texts[:runs]]
        answers = [s[0] for s in singles] + [self.generate(encode(text), max_tokens)[0]
                                             for text in prompts.texts[runs:]]
        prompts.expected = [Expected(tuple(t for t in ids if t not in eos), _text(self.tokenizer, ids), eos)
                            for ids in answers]
        prompt = encode(prompts.texts[0])
        r = SetupResult("mlx-lm alone (stream_generate)", "mlx-lm", 1, "all layers, in process", len(prompt),
                        same_tokens="ref", prompt_kind=prompts.kind)
        r.ttft_s = _median([s[1] for s in singles])
        r.decode_tps = _median([(len(s[0]) - 1) / s[2] if len(s[0]) > 1 else None for s in singles])
        r.raw["single_runs"] = [{"tokens": len(s[0]), "ttft_s": s[1], "decode_s": s[2], "wall_s": s[3]}
                                for s in singles]
        for c in concurrency:
            if c == 1:
                r.aggregate_tps[c] = _median([len(s[0]) / s[3] for s in singles])
            else:
                n, wall = self.batch(prompt, max_tokens, c)
                r.aggregate_tps[c] = n / wall
                r.raw[f"batch_{c}"] = {"tokens": n, "wall_s": wall}
        if any(c > 1 for c in concurrency):
            r.note = "concurrency > 1: batch_generate"
        return r


def _text(tokenizer, ids: list[int]) -> str:
    """What the swarm streams for these ids: detokenized, the EOS token's own text left out."""
    detok, eos = tokenizer.detokenizer, set(tokenizer.eos_token_ids)
    detok.reset()
    for t in ids:
        if t not in eos:
            detok.add_token(t)
    detok.finalize()
    return detok.text


def _batching(cluster: LocalCluster) -> tuple[int, ...]:
    """Batched decode passes and their rows, then shared prompt passes and their rows, then batched
    passes that found their kept batch as it was, summed over every node's stage (a build without
    them: 0)."""
    keys = ("batched_passes", "batched_rows", "prompt_passes", "prompt_rows", "kept_passes")
    sums = [0] * len(keys)
    for node in cluster.nodes:
        b = get_json(node.url + "/health")[1].get("decode_batching", {})
        sums = [n + b.get(k, 0) for n, k in zip(sums, keys)]
    return tuple(sums)


def measure_swarm(cluster: LocalCluster, prompts: ColdPrompts, prompt_tokens: int, max_tokens: int,
                  concurrency: list[int], runs: int,
                  mlx_batch_tps: Callable[[int], float] | None = None) -> SetupResult:
    """Single streams on `runs` cold copies, the first copy again `runs` times (warm: the prompt cache's
    figure), then each concurrency `runs` rounds on copies of their own, each paired with mlx-lm's batch
    generation if `mlx_batch_tps` is given."""
    url = cluster.entry.url
    stream_completion(url, prompts.texts[-1] + " warm-up", WARMUP_TOKENS)
    singles = [(stream_completion(url, text, max_tokens), expected)
               for text, expected in map(prompts.single, range(runs))]
    r, streamed = _swarm_result(cluster, singles, prompt_tokens, prompts.kind)
    _warm(url, r, streamed, prompts, max_tokens, runs)
    copies = iter(range(runs, len(prompts.texts)))
    for c in concurrency:
        _concurrent(cluster, r, streamed, c, prompts, copies, max_tokens, runs, mlx_batch_tps)
    r.same_tokens = _same(streamed)
    return r


def copies_needed(concurrency: list[int], runs: int) -> int:
    """Cold copies a setup sends: one per single run and one per round of each concurrency above 1."""
    return runs + runs * sum(1 for c in concurrency if c > 1)


def _warm(url: str, r: SetupResult, streamed: list, prompts: ColdPrompts, max_tokens: int, runs: int) -> None:
    """The first copy again, `runs` times: its time to first token with the stages' prompt cache."""
    text, expected = prompts.single(0)
    warm = [stream_completion(url, text, max_tokens) for _ in range(runs)]
    r.ttft_warm_s = _median([w.ttft_s for w in warm])
    r.raw["warm_runs"] = [{"ttft_s": w.ttft_s, "tokens": w.tokens} for w in warm]
    streamed += [(w, expected) for w in warm]


def measure_swarm_pair(a: LocalCluster, b: LocalCluster, prompts: ColdPrompts, prompt_tokens: int, max_tokens: int,
                       concurrency: list[int], runs: int,
                       mlx_batch_tps: Callable[[int], float] | None = None) -> tuple[SetupResult, SetupResult]:
    """`measure_swarm` of two swarms that are up at once, in alternating rounds (a b, b a, a b, ...),
    so the machine's drift and the order within a round land on both alike; each concurrency too
    (a then b). Keeps each round's pair of single-stream runs in b's raw["paired_rounds"]."""
    for cluster in (a, b):
        stream_completion(cluster.entry.url, prompts.texts[-1] + " warm-up", WARMUP_TOKENS)
    singles: dict[int, list[tuple[StreamRun, Expected]]] = {id(a): [], id(b): []}
    for i in range(runs):
        text, expected = prompts.single(i)
        for cluster in ((a, b) if i % 2 == 0 else (b, a)):
            singles[id(cluster)].append((stream_completion(cluster.entry.url, text, max_tokens), expected))
    ra, streamed_a = _swarm_result(a, singles[id(a)], prompt_tokens, prompts.kind)
    rb, streamed_b = _swarm_result(b, singles[id(b)], prompt_tokens, prompts.kind)
    rb.raw["paired_rounds"] = [{"a_decode_tps": x.decode_tps, "b_decode_tps": y.decode_tps, "b_first": i % 2 == 1}
                               for i, ((x, _), (y, _)) in enumerate(zip(singles[id(a)], singles[id(b)]))]
    for cluster, r, streamed in ((a, ra, streamed_a), (b, rb, streamed_b)):
        _warm(cluster.entry.url, r, streamed, prompts, max_tokens, runs)
    copies_a, copies_b = iter(range(runs, len(prompts.texts))), iter(range(runs, len(prompts.texts)))
    for c in concurrency:
        _concurrent(a, ra, streamed_a, c, prompts, copies_a, max_tokens, runs, mlx_batch_tps)
        _concurrent(b, rb, streamed_b, c, prompts, copies_b, max_tokens, runs, mlx_batch_tps)
    ra.same_tokens, rb.same_tokens = _same(streamed_a), _same(streamed_b)
    return ra, rb


def _swarm_result(cluster: LocalCluster, streamed: list[tuple[StreamRun, Expected]], prompt_tokens: int,
                  kind: str) -> tuple[SetupResult, list[tuple[StreamRun, Expected]]]:
    """The single-stream numbers of one swarm, and the streams so far (to compare with mlx-lm's)."""
    url = cluster.entry.url
    singles = [run for run, _ in streamed]
    split = ", ".join(f"{s['start']}-{s['end']}" for s in cluster.stages)
    r = SetupResult(f"swarm, {cluster.n} node{'s' if cluster.n > 1 else ''}", "swarm", len(cluster.stages),
                    split, prompt_tokens, prompt_kind=kind)
    r.ttft_s = _median([s.ttft_s for s in singles])
    r.decode_tps = _median([s.decode_tps for s in singles])
    r.raw["single_runs"] = [vars(s) | {"text": None, "token_ids": None} for s in singles]
    r.raw["stages"] = cluster.stages
    timing = get_json(url + "/health")[1].get("decode_timing", {})
    r.raw["decode_timing"] = timing
    r.hop_overhead_ms = timing.get("overhead_per_hop_ms")
    r.step_compute_ms, r.step_overhead_ms = timing.get("compute_ms"), timing.get("overhead_ms")
    return r, list(streamed)


def _concurrent(cluster: LocalCluster, r: SetupResult, streamed: list, c: int, prompts: ColdPrompts, copies,
                max_tokens: int, rounds: int = 1, mlx_batch_tps: Callable[[int], float] | None = None) -> None:
    """`c` simultaneous streams on `cluster`, `rounds` times: aggregate tokens/s (median) and what
    batching did, into `r`. With `mlx_batch_tps`, each round also runs mlx-lm's batch generation of
    c streams right before or after the swarm's (the order alternating), and the ratio of the pair is
    kept: the machine's speed drifts over a run by more than the differences measured."""
    if c == 1:  # the single-stream runs'
        r.aggregate_tps[1] = _median([s["tokens"] / s["wall_s"] for s in r.raw["single_runs"]])
        return
    url = cluster.entry.url
    before = _batching(cluster)
    rounds_raw = []
    for i in range(rounds):
        mlx_first = mlx_batch_tps is not None and i % 2 == 1
        mlx_tps = mlx_batch_tps(c) if mlx_first else None
        text, expected = prompts.single(next(copies))  # (the c streams of a round share it, as mlx-lm's batch)
        wall, runs_c = concurrent_completions(url, text, max_tokens, c)
        if mlx_batch_tps is not None and not mlx_first:
            mlx_tps = mlx_batch_tps(c)
        rounds_raw.append({"tokens": [s.tokens for s in runs_c], "wall_s": wall,
                           "swarm_tps": sum(s.tokens for s in runs_c) / wall, "mlx_lm_tps": mlx_tps,
                           "last_first_token_s": max(s.ttft_s for s in runs_c)})  # every stream has its first token
        streamed += [(run, expected) for run in runs_c]
    r.aggregate_tps[c] = _median([x["swarm_tps"] for x in rounds_raw])
    ratios = [x["swarm_tps"] / x["mlx_lm_tps"] for x in rounds_raw if x["mlx_lm_tps"]]
    if ratios:
        r.paired_ratio[c] = statistics.median(ratios)
    passes, rows, prompt_passes, prompt_rows, kept = (a - b for a, b in zip(_batching(cluster), before))
    r.raw[f"concurrent_{c}"] = {"rounds": rounds_raw, "batched_passes": passes, "batched_rows": rows,
                                "prompt_passes": prompt_passes, "prompt_rows": prompt_rows, "kept_passes": kept}
    parts = [f"{rows / passes:.1f} rows/batched pass"] if passes else []
    if passes and kept:
        parts.append(f"{100 * kept / passes:.0f}% of them on a batch kept as it was")
    if prompt_passes:
        parts.append(f"{prompt_rows / prompt_passes:.1f} prompts/shared prompt pass")
    parts.append(f"all first tokens in at {100 * _median([x['last_first_token_s'] / x['wall_s'] for x in rounds_raw]):.0f}%"
                 f" of the wall")
    if ratios:
        parts.append(f"vs mlx-lm's batch generation in the same round {min(ratios):.2f}-{max(ratios):.2f}x over "
                     f"{len(ratios)} round(s)")
    r.note = "; ".join(x for x in (r.note, f"@{c}: " + ", ".join(parts)) if x)
