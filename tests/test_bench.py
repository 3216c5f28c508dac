"""swarm-bench end to end on a tiny random model: the table has its rows and the swarm's tokens
equal mlx-lm alone's. No speed asserts (shared CI machines)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model_zoo import build_random_model


def _bench_cmd() -> list[str]:
    script = shutil.which("swarm-bench")
    return [script] if script else [sys.executable, "-m", "swarm.bench"]


def _rows(table: str) -> dict[str, list[str]]:
    rows = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith("| setup"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells
    return rows


def test_quick_bench_two_swarm_sizes(tmp_path: Path) -> None:
    model = build_random_model(tmp_path / "model", family="llama", n_layers=6, seed=1)
    raw = tmp_path / "raw.json"
    p = subprocess.run([*_bench_cmd(), "--quick", "--nodes", "1,2", "--concurrency", "1,2", "--skip-mlx-ring",
                        "--batch-decode", "1", "--secret", "--baseline", sys.executable, "--model", str(model),
                        "--json", str(raw)],
                       capture_output=True, text=True, timeout=420, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = _rows(p.stdout)
    install = Path(sys.executable).parent.parent.parent  # --baseline names the install its python runs
    assert set(rows) == {"mlx-lm alone (stream_generate)", "swarm, 1 node", "swarm, 2 nodes",
                         "swarm, 1 node, batch-decode 1", "swarm, 2 nodes, batch-decode 1",
                         "swarm, 1 node, secret", "swarm, 2 nodes, secret",
                         f"swarm, 1 node, baseline ({install})", f"swarm, 2 nodes, baseline ({install})"}, p.stdout
    header = p.stdout[p.stdout.index("| setup"):].splitlines()[0]
    same = [c.strip() for c in header.strip("|").split(" | ")].index("same tokens")
    assert rows["swarm, 1 node"][same] == "yes", p.stdout
    assert rows["swarm, 2 nodes"][same] == "yes", p.stdout
    assert rows["swarm, 2 nodes"][1].startswith("2 (0-3, 3-6)"), p.stdout  # an even split
    assert rows["swarm, 2 nodes, secret"][same] == "yes", p.stdout
    summary = p.stdout[p.stdout.index("With a swarm secret"):].splitlines()
    assert summary[1].startswith("- 1 stage(s): decode") and summary[2].startswith("- 2 stage(s): decode"), summary
    assert "ratio" in summary[2] and "overhead per hop" in summary[2], summary

    data = json.loads(raw.read_text())
    two = next(r for r in data["results"] if r["name"] == "swarm, 2 nodes")
    assert two["per_hop_ms"] is not None and two["prefill_mb_s"] > 0
    assert two["decode_tps"] > 0 and two["aggregate_tps"]["1"] > 0
    # at c > 1 each round is paired with mlx-lm's batch generation of the same round
    (pair,) = two["raw"]["concurrent_2"]["rounds"]
    assert pair["mlx_lm_tps"] > 0 and pair["swarm_tps"] == two["aggregate_tps"]["2"]
    assert two["paired_ratio"]["2"] == pair["swarm_tps"] / pair["mlx_lm_tps"]
    # the entry node timed its decode steps: 2 hops each, compute and overhead split out
    timing = two["raw"]["decode_timing"]
    assert timing["hops"] == 2 and timing["decode_steps"] >= 7, timing
    assert 0 < timing["compute_ms"] < timing["step_ms"], timing
    assert two["hop_overhead_ms"] == timing["overhead_per_hop_ms"] > 0


def test_lean_pipeline_measures_every_variant(tmp_path: Path) -> None:
    """benchmarks/lean_pipeline.py runs its stage processes over loopback and reports each variant."""
    model = build_random_model(tmp_path / "model", family="llama", n_layers=4, seed=2)
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "lean_pipeline.py"
    p = subprocess.run([sys.executable, str(script), "--model", str(model), "--stages", "2", "--tokens", "4",
                        "--rounds", "1"], capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.strip("|").split(" | ") for line in p.stdout.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 4, p.stdout
    for name, step, compute, hop, _ in rows:
        assert 0 < float(compute) <= float(step), (name, step, compute)
        assert float(hop) >= 0, (name, hop)


@pytest.mark.timeout(30)
def test_concurrent_clients_that_cannot_connect_say_why_at_once() -> None:
    from swarm.bench.client import concurrent_completions
    from swarm.bench.cluster import free_port
    with pytest.raises(ConnectionRefusedError):  # not the start barrier's error after its 60 s
        concurrent_completions(f"http://127.0.0.1:{free_port()}", "hi", 4, 4)


def test_free_ports_are_never_handed_out_twice() -> None:
    """The kernel may give a port it gave a moment ago (closed, not yet bound by the node it was for):
    two nodes of one cluster, or a node's API and peer port, must not both get it."""
    from swarm.bench.cluster import free_port
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)


def test_quick_bench_compares_cold_copies_and_shows_the_warm_figure_per_prompt(tmp_path: Path) -> None:
    """Every timed request sends its own copy of the prompt (no prompt cache holds it), the repeat of
    one copy is the warm column, and an input-grounded prompt gets rows of its own, its tokens equal
    mlx-lm's on the same copies."""
    model = build_random_model(tmp_path / "model", family="llama", n_layers=4, seed=3)
    raw = tmp_path / "raw.json"
    p = subprocess.run([*_bench_cmd(), "--quick", "--nodes", "1", "--concurrency", "1", "--skip-mlx-ring",
                        "--prompts", "chat,typos", "--model", str(model), "--json", str(raw)],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = _rows(p.stdout)
    assert set(rows) == {"mlx-lm alone (stream_generate)", "mlx-lm alone (stream_generate) [typos]",
                         "swarm, 1 node", "swarm, 1 node [typos]"}, p.stdout
    header = [c.strip() for c in p.stdout[p.stdout.index("| setup"):].splitlines()[0].strip("|").split(" | ")]
    cold, warm, same = header.index("TTFT ms, cold"), header.index("TTFT ms, warm"), header.index("same tokens")
    for name in ("swarm, 1 node", "swarm, 1 node [typos]"):
        assert rows[name][same] == "yes", p.stdout
        assert rows[name][cold].endswith("x)") and rows[name][warm].endswith("x)"), p.stdout
    assert rows["mlx-lm alone (stream_generate)"][warm] == "n/a"  # (mlx-lm keeps no prompt cache)
    data = json.loads(raw.read_text())
    typos = next(r for r in data["results"] if r["name"] == "swarm, 1 node [typos]")
    assert typos["prompt_kind"] == "typos" and typos["ttft_warm_s"] > 0
    assert set(data["prompt_tokens"]) == {"chat", "typos"} and min(data["prompt_tokens"].values()) > 100


def test_bench_adds_a_speculate_flag_to_the_nodes_only_when_asked() -> None:
    from swarm.bench.__main__ import build_parser
    from swarm.bench.prompts import PROMPTS, cold
    from swarm.bench.run import speculate_variants
    args = build_parser().parse_args([])
    assert args.speculate == () and args.prompts == ("chat",)
    assert speculate_variants(list(args.speculate), ("--dtype", "float32")) == []  # (the plain swarm row then)
    modes = build_parser().parse_args(["--speculate", "off,lookup"]).speculate
    assert speculate_variants(list(modes), ("--dtype", "float32")) == [
        (("--dtype", "float32", "--speculate=off"), ", speculate off", "swarm", None),
        (("--dtype", "float32", "--speculate=lookup"), ", speculate lookup", "swarm-speculate", None)]
    for bad in (["--speculate", "fast"], ["--prompts", "poems"], ["--speculate", ""]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(bad)
    copies = [cold(PROMPTS["edit"], i) for i in range(60)]
    assert len({c.split(":")[0] for c in copies}) == 60 and all(c.endswith(PROMPTS["edit"]) for c in copies)
