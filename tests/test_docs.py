"""The guide stays a guide: short, true to the tree, and free of run history in the product.

- README.md is at most MAX_README_LINES lines; the long references live under docs/.
- The README's folder tables name exactly the folders in the tree: the top-level ones and
  every package inside swarm/.
- Every file the README and docs/ point at (a link, or a backticked path) exists.
- docs/api.md names every route the HTTP API registers.
- No comment or docstring in the product names an issue, a stop (a work session) or a date:
  they say why, and history lives in git.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 300
PRODUCT = ["swarm", "discovery", "partitioner", "tui", "scripts"]
PRODUCT_FILES = ["pyproject.toml"]

# What narrates history instead of explaining: "issue 18", "issue #17", "stop 28", "session 24",
# and calendar dates.
HISTORY = re.compile(r"\bissues? ?#?\d+|\bstops? \d+\b|\bsessions? \d+\b|\b20\d\d-[01]\d-[0-3]\d\b",
                     re.IGNORECASE)


def tracked_paths() -> list[str]:
    """Files in the tree: git's tracked ones (a clean clone's), else whatever is on disk."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
        paths = [p for p in out.stdout.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        paths = []
    if paths:
        return [p for p in paths if (ROOT / p).exists()]  # a file deleted but not yet committed is gone
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
            if p.is_file() and not any(part.startswith((".", "__")) or part.endswith(".egg-info")
                                       for part in p.relative_to(ROOT).parts)]


def folder_table_entries() -> list[str]:
    """The first cell of every README table row that names a folder (`name/`)."""
    rows = re.findall(r"^\|\s*`([\w./-]+/)`\s*\|", README.read_text(), re.MULTILINE)
    return [r.rstrip("/") for r in rows]


def test_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move references under docs/"


def test_readme_folder_tables_match_the_tree() -> None:
    paths = tracked_paths()
    top = {p.split("/")[0] for p in paths if "/" in p and not p.startswith(".")}
    swarm = {"/".join(p.split("/")[:2]) for p in paths
             if p.startswith("swarm/") and p.count("/") >= 2 and p.endswith(".py")}
    named = folder_table_entries()
    assert len(named) == len(set(named)), f"a folder is named twice: {named}"
    named_top = {n for n in named if "/" not in n}
    named_swarm = {n for n in named if n.startswith("swarm/")}
    assert named_top == top, (f"README's top-level table: missing {sorted(top - named_top)}, "
                              f"not in the tree {sorted(named_top - top)}")
    assert named_swarm == swarm, (f"README's swarm/ table: missing {sorted(swarm - named_swarm)}, "
                                  f"not in the tree {sorted(named_swarm - swarm)}")


def referenced_paths(doc: Path) -> set[str]:
    """Relative links and backticked paths with a folder in them (`benchmarks/ab_hop.py`)."""
    text = doc.read_text()
    links = {m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", text)
             if not re.match(r"[a-z]+:|#", m)}
    links = {str((doc.parent / m).resolve().relative_to(ROOT)) for m in links if m}
    ticked = set(re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|sh|svg|toml))\b", text))
    return links | ticked


def exists(path: str) -> bool:
    # A path in the docs is from the repository's root, or, for the node's own modules, from swarm/.
    return (ROOT / path).exists() or (ROOT / "swarm" / path).exists()


def test_every_path_the_docs_name_exists() -> None:
    missing = {f"{doc.relative_to(ROOT)}: {p}" for doc in [README, *DOCS] for p in referenced_paths(doc)
               if not exists(p)}
    assert not missing, "the docs name files that are not in the tree:\n" + "\n".join(sorted(missing))


def test_api_reference_names_every_route() -> None:
    api = (ROOT / "docs" / "api.md").read_text()
    routes = set()
    for source in (ROOT / "swarm").rglob("*.py"):
        routes |= set(re.findall(r"add_(?:get|post|put|delete|route)\((?:\"\*\", )?\"(/[^\"]*)\"", source.read_text()))
    assert "/v1/chat/completions" in routes  # the pattern still finds the routes
    missing = sorted(r for r in routes if r.split("{")[0].rstrip("/") not in api and r.split("{")[0] != "/")
    assert not missing, f"docs/api.md does not mention {missing}"


def product_sources() -> list[Path]:
    files = [ROOT / f for f in PRODUCT_FILES]
    for folder in PRODUCT:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".sh", ".toml", ".tcss")
                  and "__pycache__" not in p.parts]
    return sorted(files)


def test_no_product_comment_names_an_issue_a_stop_or_a_date() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in product_sources()
             for n, line in enumerate(path.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not found, "say why, not when (git keeps the history):\n" + "\n".join(found)


def test_the_history_pattern_catches_what_it_should() -> None:
    for text in ("chosen for issue 18", "(issue #17)", "since stop 28", "session 24 tried it", "on 2026-11-23"):
        assert HISTORY.search(text), text
    for text in ("a stop string", "max_tokens=2026", "top 20",
                 "the stop strings' 4 limits", "issues a request"):
        assert not HISTORY.search(text), text
