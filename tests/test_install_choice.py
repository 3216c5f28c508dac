"""scripts/install.sh's choice of MLX build, by dry run: the NVIDIA driver's version decides between MLX's
CUDA 13, CUDA 12 and CPU builds; --cpu and SWARM_MLX override it. The driver is told the way a real one
tells it: an `nvidia-smi` on the PATH, or the kernel module's version file."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(platform.system() != "Linux", reason="the CUDA builds are Linux's")
PROC_LINE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Sun Jul 27 07:09:31 UTC 2025\nGCC version:  gcc 12\n"


def _dry_run(tmp_path: Path, *args: str, smi: str | None = None, proc: str | None = None,
             env: dict | None = None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    if smi is not None:
        tool = bin_dir / "nvidia-smi"
        tool.write_text(f"#!/bin/sh\necho '{smi}'\n")
        tool.chmod(0o755)
    version_file = tmp_path / "nvidia-version"
    if proc is not None:
        version_file.write_text(PROC_LINE.format(v=proc))
    # this machine's PATH without any real nvidia-smi, so only the stand-in driver speaks
    path = [str(bin_dir)] + [d for d in os.environ["PATH"].split(":") if d and not (Path(d) / "nvidia-smi").exists()]
    full_env = {k: v for k, v in os.environ.items() if k != "SWARM_MLX"}
    full_env.update(PATH=":".join(path), NVIDIA_VERSION_FILE=str(version_file), **(env or {}))
    return subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--dry-run", *args], env=full_env,
                          capture_output=True, text=True, timeout=60)


def _choice(tmp_path: Path, *args: str, **kw) -> str:
    r = _dry_run(tmp_path, *args, **kw)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_no_nvidia_driver_gets_the_cpu_build(tmp_path):
    out = _choice(tmp_path, "--test")
    assert "MLX build: cpu (no NVIDIA driver found)" in out and 'pip install -e ".[cpu,test]"' in out


@pytest.mark.skipif(shutil.which("getconf") is None, reason="needs getconf for glibc's version")
@pytest.mark.parametrize("version,build", [("580.65.06", "cuda13"), ("595.10", "cuda13"), ("570.124.06", "cuda12"),
                                           ("550.54.14", "cuda12"), ("535.183.01", "cpu")])
def test_the_driver_version_picks_the_build(tmp_path, version, build):
    glibc = subprocess.run(["getconf", "GNU_LIBC_VERSION"], capture_output=True, text=True).stdout.split()[-1]
    if tuple(map(int, glibc.split(".")[:2])) < (2, 35):
        build = "cpu"  # MLX's CUDA wheels need glibc >= 2.35
    for kw in ({"smi": version}, {"proc": version}):  # nvidia-smi, or the kernel module's file without it
        out = _choice(tmp_path / next(iter(kw)), **kw)
        assert f"MLX build: {build} (" in out and version in out, (kw, out)
        assert f'pip install -e ".[{build}]"' in out


def test_cpu_flag_and_env_override_the_driver(tmp_path):
    assert "MLX build: cpu (--cpu asked for it)" in _choice(tmp_path, "--cpu", smi="580.65.06")
    assert "MLX build: cuda12 (SWARM_MLX=cuda12)" in _choice(tmp_path, env={"SWARM_MLX": "cuda12"})
    bad = _dry_run(tmp_path, env={"SWARM_MLX": "rocm"})
    assert bad.returncode == 2 and "SWARM_MLX must be cpu, cuda12 or cuda13" in bad.stderr
    unknown = _dry_run(tmp_path, "--gpu")
    assert unknown.returncode == 2 and "unknown option --gpu" in unknown.stderr


def test_the_project_names_each_build_as_an_extra_and_no_build_as_a_plain_dependency():
    """Two MLX builds in one environment overwrite each other's libmlx: only the chosen extra brings one."""
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.replace(" ", "").startswith("mlx[")]
    extras = project["optional-dependencies"]
    for build in ("cpu", "cuda12", "cuda13"):
        assert any(d.startswith(f"mlx[{build}]") for d in extras[build]), build
