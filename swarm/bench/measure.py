"""Timed runs of one setup: mlx-lm alone in this process, or a local swarm over HTTP.

Same rules everywhere: greedy, the same prompts (BenchPrompts: each request its own by default, the
same list for every setup), a fixed max_tokens, a short warm-up first, single-stream numbers are the
median of `runs`. Aggregate tokens/s counts every generated token over the wall time of all streams,
prefill included. A swarm's warm time to first token is that of a single-stream prompt sent again
(the stages' prompt caches hold it).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from ..backend import this_backend
from ..engine.model_bytes import loaded_bytes
from .client import StreamRun, concurrent_completions, stream_completion
from .cluster import LocalCluster, get_json
from .prompts import cold
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


def _same(runs: list[tuple[str, StreamRun]], prompts: BenchPrompts) -> str:
    """"yes", or how many differ, of the (prompt, stream) pairs whose prompt has mlx-lm's ids (a node
    that gives no ids: by text, "by text"); "n/a" when none has."""
    checked = [(prompts.expected(text), run) for text, run in runs]
    checked = [(e, run) for e, run in checked if e is not None]
    if not checked:
        return "n/a"
    bad = sum(not e.matches(run) for e, run in checked)
    how = "" if all(run.token_ids is not None for _, run in checked) else ", by text"
    left = f", {len(runs) - len(checked)} not compared" if len(checked) < len(runs) else ""
    return ("yes" if not bad else f"no ({bad}/{len(checked)} differ)") + how + left


class BenchPrompts:
    """The prompts of one run: the warm-up's, each single-stream run's (the same for every setup) and
    each concurrent stream's; all distinct when `cold`, else all `text`. Keeps mlx-lm's greedy ids per
    prompt (`expected`), computed by `reference` (ids of a prompt text) when it is given."""

    def __init__(self, text: str, encode: Callable[[str], list[int]], eos: frozenset[int], cold_prompts: bool = True):
        self.text, self.encode, self.eos, self.cold = text, encode, eos, cold_prompts
        self.reference: Callable[[str], tuple[list[int], str]] | None = None  # text -> (ids, detokenized)
        self._expected: dict[str, Expected] = {}

    def _variant(self, label: str) -> str:
        return cold(self.text, label) if self.cold else self.text

    def warmup(self) -> str:
        return self._variant("0")

    def single(self, i: int) -> str:
        return self._variant(str(i + 1))

    def streams(self, c: int, round_: int) -> list[str]:
        return [self._variant(f"{c}.{round_}.{j}") for j in range(c)]

    def expect(self, text: str, ids: list[int], detokenized: str) -> None:
        self._expected[text] = Expected(tuple(t for t in ids if t not in self.eos), detokenized, self.eos)

    def expected(self, text: str) -> Expected | None:
        if text not in self._expected and self.reference is not None:
            self.expect(text, *self.reference(text))
        return self._expected.get(text)


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
        # read in the chunks a node of this backend reads a prompt alone in (entry/prompt_chunks.py): the
        # same floats
        for r in stream_generate(self.model, self.tokenizer, prompt, max_tokens=max_tokens,
                                 prefill_step_size=this_backend().prefill_chunk_alone):
            ids.append(r.token)
            times.append(time.perf_counter())
        # stream_generate yields the EOS token too; the swarm does not count it as text
        return ids, times[0] - t0, times[-1] - times[0], time.perf_counter() - t0

    def batch(self, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
        from mlx_lm.generate import batch_generate
        t0 = time.perf_counter()
        out = batch_generate(self.model, self.tokenizer, prompts, max_tokens=max_tokens, return_token_ids=True)
        return sum(len(t) for t in out.token_ids), time.perf_counter() - t0

    def weight_bytes(self) -> int:
        return loaded_bytes(self.model)

    def batch_tps(self, prompts: BenchPrompts, max_tokens: int, c: int, round_: int) -> float:
        tokens, wall = self.batch([prompts.encode(t) for t in prompts.streams(c, round_)], max_tokens)
        return tokens / wall

    def reference(self, max_tokens: int, detokenize: Callable[[list[int]], str]):
        """A prompt text's greedy (ids, detokenized text), for BenchPrompts.reference."""
        def run(text: str) -> tuple[list[int], str]:
            ids = self.generate(self.tokenizer.encode(text), max_tokens)[0]
            return ids, detokenize(ids)
        return run

    def measure(self, prompts: BenchPrompts, max_tokens: int, concurrency: list[int], runs: int,
                detokenize: Callable[[list[int]], str]) -> SetupResult:
        """Also tells `prompts` the ids of each single-stream prompt."""
        self.generate(prompts.encode(prompts.warmup()), WARMUP_TOKENS)
        singles = []
        for i in range(runs):
            text = prompts.single(i)
            singles.append(self.generate(prompts.encode(text), max_tokens))
            prompts.expect(text, singles[-1][0], detokenize(singles[-1][0]))
        r = SetupResult("mlx-lm alone (stream_generate)", "mlx-lm", 1, "all layers, in process",
                        len(prompts.encode(prompts.single(0))), same_tokens="ref")
        r.ttft_s = _median([s[1] for s in singles])
        r.decode_tps = _median([(len(s[0]) - 1) / s[2] if len(s[0]) > 1 else None for s in singles])
        r.raw["single_runs"] = [{"tokens": len(s[0]), "ttft_s": s[1], "decode_s": s[2], "wall_s": s[3]}
                                for s in singles]
        for c in concurrency:
            if c == 1:
                r.aggregate_tps[c] = _median([len(s[0]) / s[3] for s in singles])
            else:
                n, wall = self.batch([prompts.encode(t) for t in prompts.streams(c, 0)], max_tokens)
                r.aggregate_tps[c] = n / wall
                r.raw[f"batch_{c}"] = {"tokens": n, "wall_s": wall}
        if any(c > 1 for c in concurrency):
            r.note = "concurrency > 1: batch_generate"
        return r


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


def _singles(url: str, prompts: BenchPrompts, max_tokens: int, i: int) -> tuple[str, StreamRun]:
    text = prompts.single(i)
    return text, stream_completion(url, text, max_tokens)


def _warm(url: str, r: SetupResult, streamed: list, prompts: BenchPrompts, max_tokens: int) -> None:
    """The first single-stream prompt once more: its time to first token with the stages' caches warm."""
    text, run = _singles(url, prompts, max_tokens, 0)
    r.ttft_warm_s = run.ttft_s
    streamed.append((text, run))


def measure_swarm(cluster: LocalCluster, prompts: BenchPrompts, prompt_tokens: int, max_tokens: int,
                  concurrency: list[int], runs: int,
                  mlx_batch_tps: Callable[[int, int], float] | None = None) -> SetupResult:
    """Single streams `runs` times, the first one's prompt again (warm), then each concurrency `runs`
    rounds, each paired with mlx-lm's batch generation if `mlx_batch_tps` is given."""
    url = cluster.entry.url
    stream_completion(url, prompts.warmup(), WARMUP_TOKENS)
    singles = [_singles(url, prompts, max_tokens, i) for i in range(runs)]
    r, streamed = _swarm_result(cluster, singles, prompt_tokens)
    _warm(url, r, streamed, prompts, max_tokens)
    for c in concurrency:
        _concurrent(cluster, r, streamed, c, prompts, max_tokens, runs, mlx_batch_tps)
    r.same_tokens = _same(streamed, prompts)
    return r


def measure_swarm_pair(a: LocalCluster, b: LocalCluster, prompts: BenchPrompts, prompt_tokens: int, max_tokens: int,
                       concurrency: list[int], runs: int,
                       mlx_batch_tps: Callable[[int, int], float] | None = None) -> tuple[SetupResult, SetupResult]:
    """`measure_swarm` of two swarms that are up at once, in alternating rounds (a b, b a, a b, ...),
    so the machine's drift and the order within a round land on both alike; each concurrency too
    (a then b). Keeps each round's pair of single-stream runs in b's raw["paired_rounds"]."""
    for cluster in (a, b):
        stream_completion(cluster.entry.url, prompts.warmup(), WARMUP_TOKENS)
    singles: dict[int, list[tuple[str, StreamRun]]] = {id(a): [], id(b): []}
    for i in range(runs):
        for cluster in ((a, b) if i % 2 == 0 else (b, a)):
            singles[id(cluster)].append(_singles(cluster.entry.url, prompts, max_tokens, i))
    ra, streamed_a = _swarm_result(a, singles[id(a)], prompt_tokens)
    rb, streamed_b = _swarm_result(b, singles[id(b)], prompt_tokens)
    rb.raw["paired_rounds"] = [{"a_decode_tps": x.decode_tps, "b_decode_tps": y.decode_tps,
                                "b_first": i % 2 == 1}
                               for i, ((_, x), (_, y)) in enumerate(zip(singles[id(a)], singles[id(b)]))]
    _warm(a.entry.url, ra, streamed_a, prompts, max_tokens)
    _warm(b.entry.url, rb, streamed_b, prompts, max_tokens)
    for c in concurrency:
        _concurrent(a, ra, streamed_a, c, prompts, max_tokens, runs, mlx_batch_tps)
        _concurrent(b, rb, streamed_b, c, prompts, max_tokens, runs, mlx_batch_tps)
    ra.same_tokens, rb.same_tokens = _same(streamed_a, prompts), _same(streamed_b, prompts)
    return ra, rb


def _swarm_result(cluster: LocalCluster, streamed: list[tuple[str, StreamRun]], prompt_tokens: int
                  ) -> tuple[SetupResult, list[tuple[str, StreamRun]]]:
    """The single-stream numbers of one swarm, and the streams so far (to compare with mlx-lm's)."""
    url = cluster.entry.url
    singles = [run for _, run in streamed]
    split = ", ".join(f"{s['start']}-{s['end']}" for s in cluster.stages)
    r = SetupResult(f"swarm, {cluster.n} node{'s' if cluster.n > 1 else ''}", "swarm", len(cluster.stages),
                    split, prompt_tokens)
    r.ttft_s = _median([s.ttft_s for s in singles])
    r.decode_tps = _median([s.decode_tps for s in singles])
    r.raw["single_runs"] = [vars(s) | {"text": None, "token_ids": None} for s in singles]
    r.raw["stages"] = cluster.stages
    timing = get_json(url + "/health")[1].get("decode_timing", {})
    r.raw["decode_timing"] = timing
    r.hop_overhead_ms = timing.get("overhead_per_hop_ms")
    r.step_compute_ms, r.step_overhead_ms = timing.get("compute_ms"), timing.get("overhead_ms")
    return r, list(streamed)


def _concurrent(cluster: LocalCluster, r: SetupResult, streamed: list[tuple[str, StreamRun]], c: int,
                prompts: BenchPrompts, max_tokens: int, rounds: int = 1,
                mlx_batch_tps: Callable[[int, int], float] | None = None) -> None:
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
        mlx_tps = mlx_batch_tps(c, i) if mlx_first else None
        texts = prompts.streams(c, i)
        wall, runs_c = concurrent_completions(url, texts, max_tokens)
        if mlx_batch_tps is not None and not mlx_first:
            mlx_tps = mlx_batch_tps(c, i)
        rounds_raw.append({"tokens": [s.tokens for s in runs_c], "wall_s": wall,
                           "swarm_tps": sum(s.tokens for s in runs_c) / wall, "mlx_lm_tps": mlx_tps,
                           "last_first_token_s": max(s.ttft_s for s in runs_c)})  # every stream has its first token
        streamed += list(zip(texts, runs_c))
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
