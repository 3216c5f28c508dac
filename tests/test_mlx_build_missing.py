"""`pip install -e .` on Linux without an MLX build extra leaves the `mlx` package without its native
library. swarm-node then says in one line which build to install, exit status 2, not a traceback.

The install is reproduced as it is: a copy of the installed `mlx` package's Python files and its
extension module, without the `lib/libmlx.so` that the build extra (mlx-cpu, mlx-cuda) brings, put
first on the path. Importing it fails exactly as on such a machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlx
import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the build extras are Linux's")
def test_swarm_node_without_an_mlx_build_says_which_to_install(tmp_path):
    installed = Path(mlx.__path__[0])
    bare = tmp_path / "mlx"
    bare.mkdir()
    for f in installed.iterdir():
        if f.is_file() and f.suffix in (".py", ".so"):
            shutil.copy(f, bare / f.name)
    probe = subprocess.run([sys.executable, "-c", "import mlx.core"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert "libmlx.so" in probe.stderr, probe.stderr  # the install's own failure, reproduced
    for argv in ([sys.executable, "-m", "swarm.cli"], [sys.executable, "-m", "swarm.cli", "--model", "x"]):
        run = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(tmp_path)})
        assert run.returncode == 2, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
        assert lines[0].startswith("swarm-node: error: ")
        for named in ("swarm[cpu]", "swarm[cuda13]", "scripts/install.sh", "libmlx.so"):
            assert named in lines[0], lines[0]
