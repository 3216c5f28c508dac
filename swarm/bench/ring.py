"""mlx-lm's own pipeline over mx.distributed's ring backend, via mlx_ring_pipeline.py (in this package).

That script launches its ranks with `mlx.launch --hosts 127.0.0.1` (loopback only)
and prints one JSON object measured on rank 0. It builds its own prompt ids
(RING_PROMPT_TEXT repeated, cut to --prompt-tokens) and never stops early, so its
tokens are checked against mlx-lm alone on that same prompt (first 16 tokens).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from .results import SetupResult

SCRIPT = "swarm.bench.mlx_ring_pipeline"  # run as a module: shipped with swarm-bench, found by any install
# Must match the worker in mlx_ring_pipeline.py; a mismatch shows as "same tokens: no".
RING_PROMPT_TEXT = "Once upon a time, in a small village by the sea, there lived an old fisherman. "


def ring_prompt(tokenizer, prompt_tokens: int) -> list[int]:
    ids = tokenizer.encode(RING_PROMPT_TEXT) * (prompt_tokens // 8 + 1)
    return ids[:prompt_tokens]


def _last_error(output: str) -> str:
    """The last line that names an error, without ANSI colours: one line fits a table cell."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in output.splitlines()]
    errors = [line for line in lines if "Error" in line or "error" in line] or [line for line in lines if line]
    return (errors[-1] if errors else "no output")[:200].replace("|", "/")


def not_measured(ranks: int, why: str) -> SetupResult:
    return SetupResult(f"mlx-lm ring pipeline, {ranks} ranks", "mlx-ring", ranks, "-", 0,
                       note=f"TODO not measured: {why}", measured=False)


def measure_ring(model_path: Path, ranks: int, max_tokens: int, prompt_tokens: int,
                 reference_head: list[int] | None, timeout: float = 600.0) -> SetupResult:
    cmd = [sys.executable, "-m", SCRIPT, "--model", str(model_path), "--ranks", str(ranks),
           "--tokens", str(max_tokens), "--prompt-tokens", str(prompt_tokens), "--timeout", str(timeout)]
    # The script bounds itself with --timeout and kills its process group; this is a backstop.
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        return not_measured(ranks, f"the ring run failed (exit {p.returncode}: {_last_error(p.stderr + p.stdout)})")
    out = json.loads(p.stdout[p.stdout.index("{"):])
    # mlx-lm gives rank 0 the LAST layers; list the split in pipeline (layer) order.
    spans = sorted(tuple(s["layers"]) for s in out["split"])
    r = SetupResult(f"mlx-lm ring pipeline, {ranks} ranks", "mlx-ring", ranks,
                    ", ".join(f"{a}-{b}" for a, b in spans), out["prompt_tokens"],
                    ttft_s=out["ttft_s"], decode_tps=out["decode_tps"], raw=out)
    r.aggregate_tps = {1: out["generated_tokens"] / (out["ttft_s"] + (out["generated_tokens"] - 1)
                                                     / out["decode_tps"])} if out.get("decode_tps") else {}
    head = out.get("tokens_head") or []
    if reference_head is not None:
        n = min(len(head), len(reference_head))
        r.same_tokens = "yes" if n and head[:n] == reference_head[:n] else "no"
        r.same_tokens += f" (first {n})"
    r.note = f"pipeline: {out.get('pipeline')}; one stream only"
    return r
