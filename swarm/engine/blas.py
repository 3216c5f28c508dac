"""Use an optimized CPU BLAS under MLX on Linux when one is installed.

The `mlx[cpu]` Linux wheel links libmlx.so against a bundled reference (netlib)
BLAS, which is slow for the float32 matmuls that dominate prefill and decode.
libmlx.so's `cblas_sgemm` & co. are undefined symbols that the dynamic loader
binds once, when libmlx.so is loaded; after that, loading OpenBLAS with ctypes
changes nothing. The only way to redirect them without rebuilding MLX is to have
the optimized library in LD_PRELOAD *before* the process starts, and the loader
reads LD_PRELOAD only at exec time - so the node re-executes itself once with
the variable set. See docs/blas.md for measurements.

Environment:
    SWARM_BLAS=off          never re-exec (keep the bundled BLAS)
    SWARM_BLAS=/path/lib.so use this library (must export cblas_sgemm)
    SWARM_BLAS_ACTIVE       set by the re-exec to the preloaded path; also stops loops
    OPENBLAS_THREAD_TIMEOUT the re-exec sets it to SPIN_LOG2_CYCLES unless it is set already
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import sys
from pathlib import Path

from .. import environment

_SYMBOL = "cblas_sgemm"
BUNDLED_BLAS = "bundled reference BLAS"  # what blas_in_use says when nothing is preloaded

# OpenBLAS's idle workers spin 2^28 cycles (~0.1 s) after each call before they sleep. A pipeline
# stage waits for its peers most of every decode step, so by default its workers spin through the
# wait, on cores that another process of the machine wants (a co-located node computing, the user's
# apps). 2^22 cycles (~1.5 ms) still spans the gaps between the BLAS calls of one pass; several
# nodes on one machine batch better with it, one node runs the same (docs/performance.md, BLAS).
SPIN_LOG2_CYCLES = "22"


def _candidates() -> list[Path]:
    """Debian/Ubuntu locations, fastest-first as far as we know."""
    lib = Path(f"/usr/lib/{platform.machine()}-linux-gnu")
    return [
        lib / "openblas-pthread" / "libblas.so.3",
        lib / "openblas-pthread" / "libopenblas.so.0",
        lib / "openblas-openmp" / "libblas.so.3",
        lib / "openblas-openmp" / "libopenblas.so.0",
        lib / "libopenblas.so.0",
        lib / "blis-pthread" / "libblas.so.3",
        lib / "blis-openmp" / "libblas.so.3",
        lib / "libmkl_rt.so",
        Path("/opt/intel/oneapi/mkl/latest/lib/intel64/libmkl_rt.so.2"),
        Path("/opt/intel/oneapi/mkl/latest/lib/libmkl_rt.so.2"),
    ]


def exports_sgemm(path: Path) -> bool:
    """True if `path` loads and exports cblas_sgemm (a netlib libblas.so.3 does not)."""
    try:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    except OSError:
        return False
    return hasattr(lib, _SYMBOL)


def find_optimized_blas() -> Path | None:
    """The first installed optimized BLAS exporting cblas_sgemm, or None."""
    if not sys.platform.startswith("linux"):
        return None  # macOS MLX uses Accelerate; nothing to preload
    override = environment.BLAS.get() or ""
    if override and override.lower() not in ("off", "auto"):
        p = Path(override)
        return p if p.is_file() and exports_sgemm(p) else None
    for p in _candidates():
        if p.is_file() and exports_sgemm(p):
            return p
    return None


def _preloaded(env: dict[str, str]) -> list[str]:
    # ld.so accepts both colons and spaces as separators
    return env.get("LD_PRELOAD", "").replace(":", " ").split()


def reexec_env(blas: Path, env: dict[str, str]) -> dict[str, str]:
    """`env` with `blas` first in LD_PRELOAD, SWARM_BLAS_ACTIVE set, and OpenBLAS's spin shortened
    (a value the user set is kept)."""
    new = dict(env)
    new.setdefault(environment.OPENBLAS_THREAD_TIMEOUT.name, SPIN_LOG2_CYCLES)
    new["LD_PRELOAD"] = ":".join([str(blas), *_preloaded(env)])
    new[environment.BLAS_ACTIVE.name] = str(blas)
    return new


def blas_to_preload(env: dict[str, str]) -> Path | None:
    """The optimized BLAS a process started with `env` would re-execute itself with, or None: not on
    Linux, SWARM_BLAS=off, this process is the re-exec, none is installed, it is preloaded already, or
    MLX computes on a GPU here (CPU-only tuning: backend.py)."""
    if not sys.platform.startswith("linux") or environment.BLAS.is_off(env):
        return None
    if environment.BLAS_ACTIVE.get(env):
        return None  # already re-executed once; never loop even if LD_PRELOAD was dropped
    blas = find_optimized_blas()
    if blas is None or os.path.realpath(blas) in {os.path.realpath(p) for p in _preloaded(env)}:
        return None
    from ..backend import this_backend  # (imports MLX: the re-exec wastes that import, ~0.1 s)
    return blas if this_backend().cpu_tuning else None


def maybe_reexec_with_blas(argv: list[str], module: str = "swarm.cli") -> None:
    """Re-exec `python -m <module> *argv` with an optimized BLAS preloaded, if useful.

    Returns (does nothing) when there is none to preload (blas_to_preload).
    Call it before importing mlx: it works after, too (execve replaces the
    whole image), but the first import is then wasted. The re-exec starts with
    SIGINT held: `module` calls release_interrupt() once it has its handler.
    """
    env = dict(os.environ)
    blas = blas_to_preload(env)
    if blas is None:
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # execve discards unflushed Python buffers
    # Ctrl-C while the new interpreter starts would kill it mid-import ("Fatal Python error: init_import_site"):
    # the mask survives execve, so the signal waits until `module` has its handler and calls release_interrupt().
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        os.execve(sys.executable, [sys.executable, "-m", module, *argv], reexec_env(blas, env))
    finally:  # (only if execve failed)
        release_interrupt()


def release_interrupt() -> None:
    """Let a Ctrl-C held across the re-exec through (to the handler the caller has set by now)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _family(path: str) -> str:
    low = path.lower()
    for name in ("openblas", "blis", "mkl"):
        if name in low:
            return name
    return "preloaded BLAS"


def blas_in_use() -> str:
    """What serves MLX's cblas calls in this process, for /health."""
    if sys.platform == "darwin":
        return "Accelerate"
    try:
        mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                  if "/" in line}
    except OSError:
        mapped = set()
    for p in _preloaded(dict(os.environ)):
        real = os.path.realpath(p)
        if real in mapped and exports_sgemm(Path(real)):
            return f"{_family(p)} ({p})"
    return BUNDLED_BLAS
