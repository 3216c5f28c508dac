"""Every environment variable swarm reads is in swarm/environment.py and in `swarm-node --help`;
swarm/ reads none by a bare name anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

from swarm import environment
from swarm.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def env_reads(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each os.environ.get("X") / os.getenv("X") / os.environ["X"] with a literal name."""
    reads = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = ast.unparse(node.func)
            if name in ("os.environ.get", "os.getenv", "environ.get", "getenv"):
                reads.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ") \
                and isinstance(node.slice, ast.Constant):
            reads.append((node.lineno, node.slice.value))
    return reads


def test_swarm_reads_the_environment_only_through_its_one_module():
    bare = [f"{path.relative_to(ROOT)}:{line} reads ${name}" for path in sorted((ROOT / "swarm").rglob("*.py"))
            if path.name != "environment.py" for line, name in env_reads(path)]
    assert not bare, "\n".join(bare)


def test_what_discovery_and_the_dashboard_read_is_listed_too():
    listed = {v.name for v in environment.VARIABLES + environment.BENCH_VARIABLES}
    unlisted = [f"{path.relative_to(ROOT)}:{line} reads ${name}" for package in ("discovery", "tui")
                for path in sorted((ROOT / package).rglob("*.py")) for line, name in env_reads(path)
                if name not in listed]
    assert not unlisted, "\n".join(unlisted)


def test_swarm_node_help_names_every_variable():
    text = build_parser().format_help()
    assert all(v.name in text for v in environment.VARIABLES)
    assert "SWARM_SODIUM" in text and "SWARM_HOP_TRACE" in text and "SWARM_BLAS" in text
