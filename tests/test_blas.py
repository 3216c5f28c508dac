"""Optimized BLAS preloading: detection, the re-exec's environment, and unchanged greedy output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarm.engine.blas import exports_sgemm, find_optimized_blas, reexec_env

REPO = Path(__file__).resolve().parent.parent

_GENERATE = """
import json, sys
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load
from swarm.engine.blas import blas_in_use
model, _ = load(sys.argv[1])
prompt = mx.array([5, 17, 42, 99, 7, 3, 250, 11])
logits = model(prompt[None])[0, -1]
toks = [int(t) for t, _ in generate_step(prompt, model, max_tokens=16)]
print(json.dumps({"tokens": toks, "logits": logits.tolist(), "blas": blas_in_use()}))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "SWARM_BLAS", "SWARM_BLAS_ACTIVE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


@pytest.fixture
def blas() -> Path:
    path = find_optimized_blas()
    if path is None:
        pytest.skip("no optimized BLAS installed (apt-get install libopenblas0-pthread)")
    return path


def test_find_optimized_blas_returns_a_library_with_cblas_sgemm_or_none() -> None:
    path = find_optimized_blas()
    assert path is None or (path.is_file() and exports_sgemm(path))


def test_a_library_without_cblas_sgemm_is_rejected(tmp_path: Path) -> None:
    assert not exports_sgemm(tmp_path / "missing.so")
    libm = Path("/lib/x86_64-linux-gnu/libm.so.6")
    if libm.exists():
        assert not exports_sgemm(libm)


def test_swarm_blas_off_prevents_the_reexec(tmp_path: Path, blas: Path) -> None:
    out = _run_probe(tmp_path, SWARM_BLAS="off")
    assert out["reexeced"] is False and out["LD_PRELOAD"] is None


def test_reexec_env_prepends_and_marks_active() -> None:
    env = reexec_env(Path("/x/libblas.so.3"), {"LD_PRELOAD": "/a.so /b.so", "KEEP": "1"})
    assert env["LD_PRELOAD"] == "/x/libblas.so.3:/a.so:/b.so"
    assert env["SWARM_BLAS_ACTIVE"] == "/x/libblas.so.3" and env["KEEP"] == "1"


def test_reexec_env_shortens_openblas_spin_unless_the_user_set_it() -> None:
    assert reexec_env(Path("/x/libblas.so.3"), {})["OPENBLAS_THREAD_TIMEOUT"] == "22"
    assert reexec_env(Path("/x/libblas.so.3"), {"OPENBLAS_THREAD_TIMEOUT": "28"})["OPENBLAS_THREAD_TIMEOUT"] == "28"


def _run_probe(tmp_path: Path, **env: str) -> dict:
    """Run a `python -c` that calls maybe_reexec_with_blas(module=probe); report what the probe saw."""
    (tmp_path / "blas_probe.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'reexeced': True, 'argv': sys.argv[1:],"
        " 'LD_PRELOAD': os.environ.get('LD_PRELOAD'), 'active': os.environ.get('SWARM_BLAS_ACTIVE')}))\n")
    code = ("import json, os\n"
            "from swarm.engine.blas import maybe_reexec_with_blas\n"
            "maybe_reexec_with_blas(['--flag', 'x y'], module='blas_probe')\n"
            "print(json.dumps({'reexeced': False, 'LD_PRELOAD': os.environ.get('LD_PRELOAD')}))\n")
    e = _clean_env(**env)
    e["PYTHONPATH"] = os.pathsep.join([str(tmp_path), e["PYTHONPATH"]])
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_reexec_preloads_the_blas_and_keeps_argv(tmp_path: Path, blas: Path) -> None:
    out = _run_probe(tmp_path, LD_PRELOAD="/nonexistent-but-kept.so")
    assert out["reexeced"] is True and out["argv"] == ["--flag", "x y"]
    assert out["LD_PRELOAD"].split(":") == [str(blas), "/nonexistent-but-kept.so"]
    assert out["active"] == str(blas)


def test_no_reexec_when_already_preloaded(tmp_path: Path, blas: Path) -> None:
    out = _run_probe(tmp_path, LD_PRELOAD=str(blas))
    assert out["reexeced"] is False


def test_preloaded_blas_gives_the_same_greedy_tokens(tmp_path: Path, blas: Path) -> None:
    from model_zoo import build_random_model
    model = build_random_model(tmp_path / "m", family="llama", n_layers=4, seed=1)

    def run(**env: str) -> dict:
        r = subprocess.run([sys.executable, "-c", _GENERATE, str(model)], env=_clean_env(**env),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    ref, fast = run(), run(LD_PRELOAD=str(blas))
    assert ref["blas"] == "bundled reference BLAS"
    assert str(blas) in fast["blas"]
    # Summation order differs, so the last bits may too; the argmax path must not.
    assert max(abs(a - b) for a, b in zip(ref["logits"], fast["logits"])) < 1e-3
    assert fast["tokens"] == ref["tokens"]
