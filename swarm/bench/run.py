"""One benchmark run: every setup in turn on the same model, then the derived numbers and the table."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import mlx.core as mx

from discovery.memory import measure_memory

from .. import environment
from . import ring
from ..node.config import DEFAULT_BATCH_DECODE
from ..node.secrets import new_secret_text
from .cluster import LocalCluster
from .measure import BenchPrompts, MlxLmAlone, measure_swarm, measure_swarm_pair
from .prompts import PROMPTS
from .results import SetupResult, derive, hops_per_token
from .table import markdown_table

RING_HEAD = 16  # the ring script reports its first 16 tokens


@dataclass
class Report:
    text: str
    data: dict


def progress(msg: str) -> None:
    print(f"[swarm-bench] {msg}", file=sys.stderr, flush=True)


def loadavg() -> float:
    return os.getloadavg()[0]


def _with_load(r: SetupResult, before: float) -> SetupResult:
    """Other processes on the machine skew every number: keep the 1-min load next to each row."""
    r.raw["loadavg_1m"] = [round(before, 2), round(loadavg(), 2)]
    r.note = "; ".join(x for x in (r.note, f"load {before:.1f}->{loadavg():.1f}") if x)
    return r


def _install_of(python: str) -> str:
    """A short name for the install a python belongs to: /work/main/.venv/bin/python -> /work/main."""
    p = Path(python)
    return str(p.parent.parent.parent) if p.parent.name == "bin" and p.parent.parent.name.startswith(".") else python


def reference_text(tokenizer, ids: list[int]) -> str:
    """What the swarm streams for these ids: detokenized, the EOS token's own text left out."""
    detok, eos = tokenizer.detokenizer, set(tokenizer.eos_token_ids)
    detok.reset()
    for t in ids:
        if t not in eos:
            detok.add_token(t)
    detok.finalize()
    return detok.text


def run_all(model_arg: str | None, nodes: list[int], max_tokens: int, concurrency: list[int], runs: int,
            with_ring: bool, memory_limit: str, workdir: Path, batch_decode: int = 0,
            with_secret: bool = False, baseline: str | None = None, dtype: str = "auto",
            prompt_kind: str = "free", cold_prompts: bool = True, speculate: list[str] | None = None,
            draft_model: str | None = None) -> Report:
    """`prompt_kind`: which of prompts.PROMPTS; `cold_prompts`: each request a prompt of its own (else
    all the same); `speculate`: one swarm row per mode, its nodes started with `--speculate=<mode>`
    (None: no such flag), with `--draft-model=<draft_model>` where the mode uses one (draft, auto)."""
    from mlx_lm.utils import load_tokenizer

    from swarm.backend import this_backend
    from swarm.engine.blas import blas_in_use
    from swarm.engine.model_bytes import model_float_dtype
    from swarm.models.resolve import resolve_model

    backend = this_backend()
    model = resolve_model(model_arg, backend=backend.kind)
    tokenizer = load_tokenizer(model.path, eos_token_ids=model.config.get("eos_token_id"))
    eos = frozenset(tokenizer.eos_token_ids)
    prompts = BenchPrompts(PROMPTS[prompt_kind], lambda text: list(tokenizer.encode(text)), eos, cold_prompts)
    prompt = prompts.encode(prompts.single(0))  # what a node's /v1/completions does with the text
    hidden = int(model.config["hidden_size"])

    progress(f"mlx-lm alone on {model.model_id} ({model.n_layers} layers), {prompt_kind} prompt {len(prompt)} tokens, "
             f"backend {backend.describe()}, --dtype {dtype}")
    load = loadavg()
    # mlx-lm's weights in the dtype the nodes run theirs (--dtype, as this backend reads it)
    alone = MlxLmAlone(model.path, dtype=backend.weights_dtype(dtype))
    act_dtype = model_float_dtype(alone.model)  # the activations' (and the wire's): what the layers compute in
    act_bytes = act_dtype.size
    detokenize = partial(reference_text, tokenizer)
    ref = alone.measure(prompts, max_tokens, concurrency, runs, detokenize)
    _with_load(ref, load)
    ring_ref = None
    ring_sizes = [k for k in nodes if k > 1] if with_ring else []
    if ring_sizes:
        ring_ref = alone.generate(ring.ring_prompt(tokenizer, len(prompt)), RING_HEAD)[0]
    results: list[SetupResult] = [ref]

    variants = swarm_variants(dtype, with_secret, batch_decode, baseline, speculate, draft_model)
    common = () if dtype == "auto" else ("--dtype", dtype)  # every node of every setup

    # Pairing each swarm's concurrent rounds with a batch generation keeps mlx-lm's copy of the model
    # loaded beside the nodes' copy: only with room for both; else its ratios are to the first row's.
    paired = any(c > 1 for c in concurrency) and 2 * alone.weight_bytes() < measure_memory()[1]
    mlx_batch_tps = partial(alone.batch_tps, prompts, max_tokens) if paired else None
    if paired:  # each concurrent stream's prompt is compared with mlx-lm's ids for it
        prompts.reference = alone.reference(max_tokens, detokenize)
    else:
        alone.close()  # (concurrent streams' prompts have no ids of mlx-lm's then: not compared)
        if any(c > 1 for c in concurrency):
            progress("no room for mlx-lm's copy of the model beside the nodes': concurrent ratios are to its first row")

    for n in nodes:
        if with_secret:
            results += _open_and_secret(n, workdir, str(model.path), memory_limit, len(prompt), max_tokens,
                                        concurrency, runs, prompts, mlx_batch_tps, common)
        for extra, suffix, kind, python in variants:
            progress(f"swarm with {n} node(s){suffix}: starting")
            with LocalCluster(n, workdir, str(model.path), memory_limit, extra_args=extra, python=python) as cluster:
                load = loadavg()
                progress(f"swarm with {n} node(s): plan {cluster.topology['plan']['plan_id']} stages "
                         + ", ".join(f"{s['node_id']}[{s['start']},{s['end']})" for s in cluster.stages))
                r = measure_swarm(cluster, prompts, len(prompt), max_tokens, concurrency, runs, mlx_batch_tps)
                r.name += suffix
                r.kind = kind
                results.append(_with_load(r, load))

    if paired:
        prompts.reference = None
        alone.close()  # (kept until here: each swarm's concurrent rounds are paired with its batch generation)
    if with_ring:
        for k in ring_sizes:
            progress(f"mlx-lm ring pipeline with {k} ranks")
            load = loadavg()
            results.append(_with_load(ring.measure_ring(model.path, k, max_tokens, len(prompt), ring_ref), load))

    derive(results, hidden, act_bytes)
    header = (f"swarm-bench {datetime.datetime.now().isoformat(timespec='seconds')} on "
              f"{os.cpu_count()}-core {platform.machine()} {platform.system()}, mlx {mx.__version__} "
              f"backend {backend.describe()}, BLAS: {blas_in_use()} "
              f"threads={environment.OPENBLAS_NUM_THREADS.get() or 'default'}, 1-min load average at the end {loadavg():.1f}\n"
              f"weights: --dtype {dtype} (activations {str(act_dtype).removeprefix('mlx.core.')})\n"
              f"model: {model.model_id} ({model.n_layers} layers, hidden {hidden}), {prompt_kind} prompt {len(prompt)} "
              f"tokens ({'a distinct one per request' if cold_prompts else 'the same for every request'}), "
              f"max_tokens {max_tokens}, greedy, single-stream numbers are the median of {runs} run(s)\n")
    notes = (
        "\nRatios in parentheses are to mlx-lm alone (TTFT: time ratio, lower is better).\n"
        "TTFT: each request a prompt new to the nodes (unless --same-prompt); TTFT warm: the first single-stream "
        "prompt sent again, which the stages' prompt caches hold (its ratio is to mlx-lm's cold TTFT).\n"
        "Speculate rows: nodes started with --speculate=<mode> (--speculate).\n"
        "Decode tok/s: one stream, first token to last. Aggregate tok/s: all tokens of c simultaneous "
        "streams / wall time, prefill included (the c clients connect first and send at once); at c > 1 a "
        "swarm row's is the median of --runs rounds, and its "
        "ratio the median of each round's ratio to mlx-lm's batch generation of c streams run in the same round "
        "(right before or after it, the order alternating), since the machine's speed drifts over a run "
        "(unless mlx-lm's copy of the model does not fit beside the nodes': then to the first row's).\n"
        f"Per-hop decode ms: (s/token with K stages - s/token with 1 stage) / hops, hops = K "
        f"(K-1 activations + 1 token back; entry = stage 0); swarm vs the 1-node swarm, ring vs mlx-lm alone.\n"
        "Decode step ms: the median decode step of one stream, split by the entry node into the time the "
        "stages spent computing and the rest (mlx-lm alone and the ring: the whole step).\n"
        "Overhead/hop ms: measured by the entry node on every decode step of the single-stream runs, "
        "(step wall time - time the stages spent computing) / hops, median; what the swarm adds per hop "
        "(serialization, TCP, event loop, thread hand-offs) without the run-to-run noise of the column before.\n"
        f"Prefill act. MB/s: computed, prompt_tokens x hidden x {act_bytes} B x (stages-1) / TTFT "
        "(not read from the transport).\n"
        "Batch-decode rows: nodes started with --batch-decode N (decode steps of up to N concurrent requests "
        f"share a pass; the default is {DEFAULT_BATCH_DECODE}); batched rows may differ from a lone request in the last bits, so "
        "greedy text can differ.\n"
        "Baseline rows: the same nodes run by another install's python (--baseline), with its defaults.\n"
        "Same tokens: the token ids of every swarm request (return_token_ids) equal mlx-lm alone's greedy ids, "
        "EOS left out (a baseline build that gives no ids: its text, \"by text\"); the ring compares token ids "
        "of its own prompt.\n"
        "Note: load a->b is the machine's 1-min load average before/after a setup; above the core count, "
        "other processes shared the CPU and the numbers of that row are skewed.\n")
    text = header + "\n" + markdown_table(results, concurrency) + "\n" + secret_summary(results) + notes
    data = {"header": header.strip(), "prompt_tokens": len(prompt), "max_tokens": max_tokens, "runs": runs,
            "hidden": hidden, "act_bytes": act_bytes, "hops": {r.stages: hops_per_token(r.stages) for r in results},
            "results": [r.to_dict() for r in results]}
    return Report(text, data)


def swarm_variants(dtype: str, with_secret: bool, batch_decode: int, baseline: str | None,
                   speculate: list[str] | None, draft_model: str | None = None
                   ) -> list[tuple[tuple[str, ...], str, str, str | None]]:
    """The swarm setups each size runs, but the open and secret pair (--secret: _open_and_secret): (extra
    node args, row name suffix, kind, python to run the nodes with: None is this install). Kinds other
    than "swarm" are no baseline for per-hop numbers. A node flag is added only when asked for."""
    common = () if dtype == "auto" else ("--dtype", dtype)  # every node of every setup
    variants: list[tuple[tuple[str, ...], str, str, str | None]] = [] if with_secret else [(common, "", "swarm", None)]
    if speculate and not with_secret:  # a row per mode instead (the first one is the per-hop baseline's kind)
        def drafting(mode: str) -> tuple[str, ...]:
            return (f"--draft-model={draft_model}",) if draft_model and mode in ("draft", "auto") else ()
        variants = [((*common, f"--speculate={mode}", *drafting(mode)), f", speculate {mode}",
                     "swarm" if k == 0 else "swarm-speculate", None) for k, mode in enumerate(speculate)]
    if batch_decode > 0:
        variants.append(((*common, "--batch-decode", str(batch_decode)), f", batch-decode {batch_decode}",
                         "swarm-batched", None))
    if baseline:
        variants.append((common, f", baseline ({_install_of(baseline)})", "swarm-baseline", baseline))
    return variants


def _open_and_secret(n: int, workdir: Path, model: str, memory_limit: str, prompt_tokens: int, max_tokens: int,
                     concurrency: list[int], runs: int, prompts: BenchPrompts,
                     mlx_batch_tps: Callable[[int, int], float] | None,
                     common: tuple[str, ...] = ()) -> list[SetupResult]:
    """The open swarm of n nodes and one with a swarm secret, both up at once, in alternating rounds."""
    progress(f"swarm with {n} node(s), open and with a secret side by side: starting")
    secret = (*common, f"--secret={new_secret_text()}")
    for sub in ("open", "secret"):
        (workdir / sub).mkdir(exist_ok=True)
    # each swarm its own state dirs: two nodes of one index may not share one
    with LocalCluster(n, workdir / "open", model, memory_limit, extra_args=common) as open_, \
            LocalCluster(n, workdir / "secret", model, memory_limit, extra_args=secret) as sealed:
        load = loadavg()
        ro, rs = measure_swarm_pair(open_, sealed, prompts, prompt_tokens, max_tokens, concurrency, runs,
                                    mlx_batch_tps)
    rs.name += ", secret"
    rs.kind = "swarm-secret"
    for r in (ro, rs):
        r.note = "; ".join(x for x in (r.note, "side by side with the other of its pair") if x)
        _with_load(r, load)
    return [ro, rs]


def secret_summary(results: list[SetupResult]) -> str:
    """What a swarm secret cost, per swarm size: the secret row against the open row of this run."""
    lines = []
    for r in results:
        if r.kind != "swarm-secret" or not r.measured:
            continue
        base = next((o for o in results if o.kind == "swarm" and o.stages == r.stages and o.measured), None)
        if base is None or not (base.decode_tps and r.decode_tps):
            continue
        line = (f"- {r.stages} stage(s): decode {r.decode_tps:.1f} vs {base.decode_tps:.1f} tok/s open, "
                f"ratio {r.decode_tps / base.decode_tps:.3f}")
        rounds = [p["b_decode_tps"] / p["a_decode_tps"] for p in r.raw.get("paired_rounds", ())
                  if p["a_decode_tps"] and p["b_decode_tps"]]
        if rounds:
            line += (f" (per round: median {statistics.median(rounds):.3f}, {min(rounds):.3f} to {max(rounds):.3f}, "
                     f"{len(rounds)} rounds)")
        if r.hop_overhead_ms is not None and base.hop_overhead_ms is not None:
            line += (f"; overhead per hop {r.hop_overhead_ms:.3f} vs {base.hop_overhead_ms:.3f} ms open, "
                     f"{r.hop_overhead_ms - base.hop_overhead_ms:+.3f} ms")
        if r.ttft_s and base.ttft_s:
            line += f"; TTFT ratio {r.ttft_s / base.ttft_s:.3f}"
        lines.append(line)
    if not lines:
        return ""
    return ("\nWith a swarm secret (proved hellos, every frame sealed with AES-GCM) vs open: both swarms up at once, "
            "single streams in alternating rounds (open first, then secret first, ...), so the machine's drift lands "
            "on both; overhead per hop: each entry's median over the same rounds' decode steps:\n"
            + "\n".join(lines) + "\n")
