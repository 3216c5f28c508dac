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
    # every request a prompt of its own: the cold column is the prompt's read, the warm one a prompt again
    cols = [c.strip() for c in header.strip("|").split(" | ")]
    cold, warm = cols.index("TTFT ms"), cols.index("TTFT warm ms")
    assert rows["mlx-lm alone (stream_generate)"][warm] == "n/a", p.stdout
    assert rows["swarm, 2 nodes"][cold].endswith("x)") and rows["swarm, 2 nodes"][warm].endswith("x)"), p.stdout
    assert "a distinct one per request" in p.stdout, p.stdout
    summary = p.stdout[p.stdout.index("With a swarm secret"):].splitlines()
    assert summary[1].startswith("- 1 stage(s): decode") and summary[2].startswith("- 2 stage(s): decode"), summary
    assert "ratio" in summary[2] and "overhead per hop" in summary[2], summary

    data = json.loads(raw.read_text())
    two = next(r for r in data["results"] if r["name"] == "swarm, 2 nodes")
    assert two["ttft_warm_s"] > 0 and two["ttft_s"] > 0
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


def test_input_grounded_prompts_a_table_each_and_every_stream_compared(tmp_path: Path) -> None:
    """--prompts: one table per kind, each with mlx-lm's ids for every prompt (concurrent streams' too)."""
    model = build_random_model(tmp_path / "model", family="llama", n_layers=4, seed=1)
    p = subprocess.run([*_bench_cmd(), "--quick", "--nodes", "1", "--concurrency", "1,2", "--skip-mlx-ring",
                        "--prompts", "edit,names", "--model", str(model)],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    tables = p.stdout.split("swarm-bench ")[1:]
    assert len(tables) == 2 and "edit prompt" in tables[0] and "names prompt" in tables[1], p.stdout
    for table in tables:
        header = table[table.index("| setup"):].splitlines()[0]
        same = [c.strip() for c in header.strip("|").split(" | ")].index("same tokens")
        assert _rows(table)["swarm, 1 node"][same] == "yes", table


def test_speculate_rows_pass_the_node_flag_only_when_asked() -> None:
    from swarm.bench.__main__ import build_parser
    from swarm.bench.run import swarm_variants
    assert [v[0] for v in swarm_variants("auto", False, 0, None, None)] == [()]
    assert swarm_variants("auto", False, 0, None, ["off", "lookup"]) == [
        (("--speculate=off",), ", speculate off", "swarm", None),
        (("--speculate=lookup",), ", speculate lookup", "swarm-speculate", None)]
    assert swarm_variants("float32", False, 4, None, ["lookup"])[0][0] == ("--dtype", "float32", "--speculate=lookup")
    assert build_parser().parse_args(["--speculate", "off,lookup"]).speculate == ["off", "lookup"]
    assert [v[0] for v in swarm_variants("auto", False, 0, None, ["lookup", "draft"], "/m/small")] == [
        ("--speculate=lookup",), ("--speculate=draft", "--draft-model=/m/small")]
    assert build_parser().parse_args(["--draft-model", "/m/small"]).draft_model == "/m/small"
    assert build_parser().parse_args([]).speculate is None
    assert build_parser().parse_args(["--prompts", "free,typos"]).prompts == ["free", "typos"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--prompts", "poems"])


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
        concurrent_completions(f"http://127.0.0.1:{free_port()}", ["hi"] * 4, 4)


def test_free_ports_are_never_handed_out_twice() -> None:
    """The kernel may give a port it gave a moment ago (closed, not yet bound by the node it was for):
    two nodes of one cluster, or a node's API and peer port, must not both get it."""
    from swarm.bench.cluster import free_port
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
