"""Aggregate tok/s of c simultaneous streams on several swarms and mlx-lm's batch_generate, in alternating rounds.

    python benchmarks/cohorts_ab.py --setup main=/work/main/.venv/bin/python \
        --setup "bd4=.venv/bin/python --batch-decode 4" \
        --setup "main_1t=OPENBLAS_NUM_THREADS=1 /work/main/.venv/bin/python" [--nodes 3] [--concurrency 8] [--rounds 3]

Each --setup is NAME=[VAR=value ...] PYTHON [node args...]: one local swarm per setup (loopback, static peers,
even split, entry = stage 0, as swarm-bench starts them), all up at once. Then in every round:
mlx-lm's batch_generate on c copies of the bench prompt in this process, and c streams on each
swarm, in an order that rotates from round to round, so the machine's drift (other processes on
a shared machine) lands on every setup alike; each swarm row is printed with its ratio to the
mlx-lm run of the same round, the load, and what batching did (rows per pass, prompts per
shared prompt pass, when the last first token came). Every streamed text is checked against
mlx-lm's greedy text. Idle swarms cost nothing while another setup runs (their nodes wait on
sockets).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.engine import blas  # noqa: E402  (imports no mlx)


def _with_optimized_blas() -> None:
    """Re-exec once with the optimized BLAS preloaded, as swarm-bench and every node do: mlx-lm's
    batch_generate in this process on the bundled reference BLAS runs many times slower."""
    found = blas.find_optimized_blas()
    if found is None or os.environ.get("SWARM_BLAS_ACTIVE") or os.environ.get("SWARM_BLAS", "").lower() == "off":
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], blas.reexec_env(found, dict(os.environ)))


if __name__ == "__main__":
    _with_optimized_blas()

from swarm.bench.client import concurrent_completions, stream_completion  # noqa: E402
from swarm.bench.cluster import LocalCluster  # noqa: E402
from swarm.bench.measure import MlxLmAlone, _batching  # noqa: E402
from swarm.bench.prompts import PROMPT  # noqa: E402
from swarm.bench.run import reference_text  # noqa: E402

from ab_hop import _cwd  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="append", required=True, help="NAME=[VAR=value ...] PYTHON [node args...]")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()

    from mlx_lm.utils import load_tokenizer

    from swarm.models.resolve import resolve_model
    from swarm.node.node import backend_name
    model = resolve_model(args.model, backend=backend_name())
    tokenizer = load_tokenizer(model.path, eos_token_ids=model.config.get("eos_token_id"))
    prompt = list(tokenizer.encode(PROMPT))
    alone = MlxLmAlone(model.path, cast_float32=backend_name() == "cpu")
    ref_ids = alone.generate(prompt, args.tokens)[0]
    reference = reference_text(tokenizer, ref_ids)

    work = Path(tempfile.mkdtemp(prefix="cohorts_ab-"))
    clusters: dict[str, LocalCluster] = {}
    try:
        for spec in args.setup:
            name, rest = spec.split("=", 1)
            words = shlex.split(rest)
            env = {}
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # leading VAR=value words
                var, value = words.pop(0).split("=", 1)
                env[var] = value
            python, *extra = words
            (work / name).mkdir()
            # (a loaded machine: nodes that load slowly are left out of plans for a while before they converge)
            cluster = LocalCluster(args.nodes, work / name, str(model.path), extra_args=tuple(extra),
                                   ready_timeout=900, python=python)
            saved = dict(os.environ)
            os.environ.update(env)  # the nodes inherit it (e.g. OPENBLAS_NUM_THREADS=1), this process keeps its own
            try:
                with _cwd(work / name):
                    clusters[name] = cluster.__enter__()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            stream_completion(cluster.entry.url, PROMPT, 4)  # warm-up
        names = ["mlx-lm"] + list(clusters)
        ratios: dict[str, list[float]] = {n: [] for n in clusters}
        tps: dict[str, list[float]] = {n: [] for n in names}
        for rnd in range(args.rounds):
            k = rnd % len(names)
            order = names[k:] + names[:k]
            got: dict[str, float] = {}
            lines = []
            for name in order:
                load = os.getloadavg()[0]
                if name == "mlx-lm":
                    n, wall = alone.batch(prompt, args.tokens, args.concurrency)
                    got[name] = n / wall
                    lines.append((name, f"{got[name]:6.1f} tok/s  load {load:.1f}->{os.getloadavg()[0]:.1f}"))
                    continue
                cluster = clusters[name]
                before = _batching(cluster)
                wall, runs = concurrent_completions(cluster.entry.url, PROMPT, args.tokens, args.concurrency)
                passes, rows, ppasses, prows, kept = (a - b for a, b in zip(_batching(cluster), before))
                got[name] = sum(s.tokens for s in runs) / wall
                same = sum(s.text == reference for s in runs)
                first_in = max(s.ttft_s for s in runs) / wall
                lines.append((name, f"{got[name]:6.1f} tok/s  load {load:.1f}->{os.getloadavg()[0]:.1f}  "
                                    f"{rows / max(passes, 1):.1f} rows/pass, {100 * kept / max(passes, 1):.0f}% kept, "
                                    f"{prows / max(ppasses, 1):.1f} prompts/prompt pass, first tokens in at "
                                    f"{100 * first_in:.0f}%, same text {same}/{len(runs)}"))
            for name, _ in lines:
                tps[name].append(got[name])
                if name in ratios:
                    ratios[name].append(got[name] / got["mlx-lm"])
            print(f"round {rnd + 1} (order {' '.join(order)}):", flush=True)
            for name, text in lines:
                ratio = f" ({got[name] / got['mlx-lm']:.2f}x)" if name != "mlx-lm" else ""
                print(f"  {name:>12}: {text}{ratio}", flush=True)
        print(f"medians over {args.rounds} rounds, {args.nodes} nodes, {args.concurrency} streams:")
        for name in names:
            extra = f", ratio to mlx-lm {statistics.median(ratios[name]):.2f}x" if name in ratios else ""
            print(f"  {name:>12}: {statistics.median(tps[name]):.1f} tok/s{extra}")
    finally:
        for cluster in clusters.values():
            cluster.stop()
        alone.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
