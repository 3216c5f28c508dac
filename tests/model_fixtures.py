"""Models the tests use: the built-in default and small random-weight ones per family.

Imported by test modules (`from model_fixtures import ...`) so that pytest sees the fixtures.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FAMILIES = ["llama", "qwen2", "qwen3"]


@pytest.fixture(scope="session")
def default_model():
    from swarm.models.resolve import resolve_model
    return resolve_model(None)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """One small deterministic random-weight model per family, built once per session."""
    from model_zoo import build_random_model
    root = tmp_path_factory.mktemp("tiny-models")
    return {f: build_random_model(root / f, family=f, n_layers=6, seed=1) for f in FAMILIES}
