"""The one markdown table, with ratios to mlx-lm alone in parentheses."""

from __future__ import annotations

from .results import SetupResult


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return fmt.format(x) if x is not None else "n/a"


def _with_ratio(x: float | None, ref: float | None, fmt: str = "{:.1f}") -> str:
    if x is None:
        return "n/a"
    return f"{fmt.format(x)} ({x / ref:.2f}x)" if ref else fmt.format(x)


def _aggregate(r: SetupResult, ref: SetupResult | None, c: int) -> str:
    x = r.aggregate_tps.get(c)
    if x is not None and c in r.paired_ratio:  # against mlx-lm's run of the same round, not the first row's
        return f"{x:.1f} ({r.paired_ratio[c]:.2f}x)"
    return _with_ratio(x, ref.aggregate_tps.get(c) if ref else None)


def _step(r: SetupResult) -> str:
    if r.step_compute_ms is not None and r.step_overhead_ms is not None:
        return f"{r.step_compute_ms:.1f} + {r.step_overhead_ms:.1f}"
    return f"{1e3 / r.decode_tps:.1f} (all)" if r.decode_tps else "n/a"


def markdown_table(results: list[SetupResult], concurrency: list[int]) -> str:
    ref = next((r for r in results if r.kind == "mlx-lm" and r.measured), None)
    head = ["setup", "stages (layers)", "TTFT ms", "TTFT warm ms", "decode tok/s, 1 stream",
            *[f"aggregate tok/s @{c}" for c in concurrency], "decode step ms: compute + overhead", "per-hop decode ms", "overhead/hop ms", "prefill act. MB/s",
            "same tokens", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 3) + ["---"] * 2) + "|"]
    for r in results:
        if not r.measured:
            cells = [r.name, str(r.stages), *["not measured"] * (len(head) - 4), "n/a", r.note]
        else:
            # TTFT ratio is time (lower is better); the others are rates (higher is better).
            cells = [r.name, f"{r.stages} ({r.split})",
                     _with_ratio(r.ttft_s * 1e3 if r.ttft_s else None, ref.ttft_s * 1e3 if ref else None, "{:.0f}"),
                     _with_ratio(r.ttft_warm_s * 1e3 if r.ttft_warm_s else None, ref.ttft_s * 1e3 if ref else None,
                                 "{:.0f}"),
                     _with_ratio(r.decode_tps, ref.decode_tps if ref else None),
                     *[_aggregate(r, ref, c) for c in concurrency],
                     _step(r), _num(r.per_hop_ms, "{:.2f}"), _num(r.hop_overhead_ms, "{:.2f}"), _num(r.prefill_mb_s), r.same_tokens, r.note]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
