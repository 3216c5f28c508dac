"""Knowledge flows one way: each package of swarm/ imports only the packages below it, the stage and
planning know nothing of the entry, the partitioner stays pure, the dashboard speaks only HTTP.
Read from the source (every import statement, also those inside functions), not from what happens
to be loaded."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# swarm/'s packages (and top-level modules), lowest first: each may import only those before it.
LAYERS = ["environment", "tasks", "events", "backend", "mlx_build", "models", "engine", "transport", "weights", "stage", "planning",
          "entry", "status", "api", "node", "bench", "cli"]
NO_ENTRY = ("stage", "planning", "transport", "engine")


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, as absolute dotted names."""
    package = list(path.relative_to(ROOT).with_suffix("").parts)[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + (node.module.split(".") if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)  # `from . import x`: x may be a module
    return names


def swarm_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "swarm" and len(parts) > 1 else None


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def own_part(path: Path) -> str:
    parts = path.relative_to(ROOT / "swarm").with_suffix("").parts
    return parts[0]


def test_every_part_of_swarm_is_in_a_layer():
    parts = {own_part(p) for p in modules("swarm")} - {"__init__"}
    assert parts <= set(LAYERS), f"place {sorted(parts - set(LAYERS))} in LAYERS"


def test_no_module_imports_a_package_above_it():
    wrong = []
    for path in modules("swarm"):
        part = own_part(path)
        if part == "__init__":
            continue
        for name in imports_of(path):
            other = swarm_part(name)
            if other in LAYERS and other != part and LAYERS.index(other) > LAYERS.index(part):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_stage_planning_transport_and_engine_import_nothing_from_the_entry():
    wrong = [f"{path.relative_to(ROOT)} imports {name}" for path in modules("swarm") if own_part(path) in NO_ENTRY
             for name in imports_of(path) if swarm_part(name) == "entry"]
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_the_partitioner_is_pure_discovery_knows_no_swarm_and_the_dashboard_speaks_only_http():
    rules = {"partitioner": ("swarm", "discovery", "tui", "mlx", "mlx_lm", "zeroconf", "aiohttp", "socket",
                             "asyncio", "os", "subprocess"),
             "discovery": ("swarm", "tui", "mlx", "mlx_lm"),
             "tui": ("swarm", "discovery", "partitioner", "mlx", "mlx_lm")}
    wrong = [f"{path.relative_to(ROOT)} imports {name}" for package, banned in rules.items()
             for path in modules(package) for name in imports_of(path) if name.split(".")[0] in banned]
    assert not wrong, "\n".join(sorted(set(wrong)))
