"""What one setup measured, and the numbers derived from comparing setups."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SetupResult:
    name: str
    kind: str  # "mlx-lm" | "swarm" | "swarm-batched" | "swarm-secret" | "mlx-ring"
    stages: int  # pipeline stages (1 for mlx-lm alone)
    split: str  # layer ranges per stage, e.g. "0-15, 15-30"
    prompt_tokens: int
    ttft_s: float | None = None  # median over single-stream runs (each prompt new to the nodes by default)
    ttft_warm_s: float | None = None  # a single-stream prompt sent again (the nodes' prompt caches hold it)
    decode_tps: float | None = None  # one stream, first token -> last
    aggregate_tps: dict[int, float | None] = field(default_factory=dict)  # concurrency -> tokens/s
    # concurrency -> median over rounds of (this / mlx-lm's batch generation run in the same round)
    paired_ratio: dict[int, float] = field(default_factory=dict)
    same_tokens: str = "n/a"  # "yes" | "no (...)" | "ref" | "n/a"
    note: str = ""
    measured: bool = True
    # derived (see derive()):
    per_hop_ms: float | None = None
    # measured by the entry node per decode step: (step wall - stage compute) / hops (swarm/entry/hop_timing.py)
    hop_overhead_ms: float | None = None
    step_compute_ms: float | None = None  # median time the stages computed per decode step
    step_overhead_ms: float | None = None  # median step wall time minus that
    prefill_mb_s: float | None = None
    raw: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def hops_per_token(stages: int) -> int:
    """Network messages per decoded token with the entry on stage 0 (transport/messages.py):
    K-1 activations forward + 1 token id back; 0 for a single stage."""
    return stages if stages > 1 else 0


def derive(results: list[SetupResult], hidden: int, act_bytes: int) -> None:
    """Fill per-hop decode overhead and prefill activation rate in place.

    Per-hop: (decode s/token with K stages - with 1 stage of the same kind) / hops.
    The swarm's baseline is the 1-node swarm; the ring's is mlx-lm alone (1 process).
    Prefill rate is computed, not taken from the transport:
    prompt_tokens * hidden * act_bytes * (stages - 1) / TTFT (TTFT ~ prefill time).
    """
    swarm_base = _one_stage(results, "swarm")
    base = {"swarm": swarm_base, "swarm-secret": swarm_base, "mlx-ring": _one_stage(results, "mlx-lm")}
    for r in results:
        if not r.measured or r.stages < 2:
            continue
        b = base.get(r.kind)
        if b and b.decode_tps and r.decode_tps:
            r.per_hop_ms = (1 / r.decode_tps - 1 / b.decode_tps) / hops_per_token(r.stages) * 1e3
        if r.ttft_s:
            r.prefill_mb_s = r.prompt_tokens * hidden * act_bytes * (r.stages - 1) / r.ttft_s / 1e6


def _one_stage(results: list[SetupResult], kind: str) -> SetupResult | None:
    return next((r for r in results if r.kind == kind and r.stages == 1 and r.measured), None)
