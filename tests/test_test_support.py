"""The test support stays where a newcomer looks for it: fixtures in conftest.py (found by pytest, never
imported), plain helpers once in helpers.py, and no lint silenced to import a fixture by name."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SILENCED = re.compile(r"noqa:[^\n]*\bF(401|811)\b")


@lru_cache
def modules(root: Path) -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(root.glob("*.py"))}


def is_fixture(node: ast.AST) -> bool:
    def named(d: ast.AST) -> bool:
        d = d.func if isinstance(d, ast.Call) else d
        return isinstance(d, ast.Attribute) and d.attr == "fixture" or isinstance(d, ast.Name) and d.id == "fixture"
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(named, node.decorator_list))


def top_level(tree: ast.Module) -> dict[str, ast.AST]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def silenced_imports(root: Path) -> list[str]:
    return [f"{p.name}:{i}" for p in sorted(root.glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if SILENCED.search(line)]


def fixtures_imported_by_name(root: Path) -> list[str]:
    trees = modules(root)
    fixtures = {m: {name for name, node in top_level(t).items() if is_fixture(node)} for m, t in trees.items()}
    return [f"{m} imports {name} from {node.module}" for m, tree in trees.items() for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in fixtures
            for name in (a.name for a in node.names) if name in fixtures[node.module]]


def imports_of_test_modules(root: Path) -> list[str]:
    return [f"{m} imports {name}" for m, tree in modules(root).items() for node in ast.walk(tree)
            for name in ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                         [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if name.startswith("test_")]


def copies(root: Path) -> list[str]:
    """Helpers of helpers.py written again in another module, and fixtures of conftest.py written again as
    a module's own fixture (a module says how its `model` or `node` differs in MODEL or NODE_ARGS)."""
    trees = modules(root)
    helpers = set(top_level(trees["helpers"]))
    fixtures = {name for name, node in top_level(trees["conftest"]).items() if is_fixture(node)}
    return [f"{m}.py defines {name} again (see {'helpers.py' if name in helpers else 'conftest.py'})"
            for m, tree in trees.items() if m not in ("helpers", "conftest")
            for name, node in top_level(tree).items() if name in helpers or name in fixtures and is_fixture(node)]


def test_no_test_module_silences_an_unused_or_redefined_import():
    assert silenced_imports(TESTS) == []


def test_fixtures_come_from_conftest_never_imported_by_name():
    assert fixtures_imported_by_name(TESTS) == []


def test_no_test_module_imports_another():
    assert imports_of_test_modules(TESTS) == []


def test_each_shared_helper_and_fixture_is_written_once():
    assert copies(TESTS) == []
