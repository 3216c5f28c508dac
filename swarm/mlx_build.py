"""Is an MLX build installed? On Linux the `mlx` package alone has no native library: the build is an
extra (`swarm[cpu]`, `swarm[cuda12]`, `swarm[cuda13]`: pyproject.toml) that scripts/install.sh picks.
Without it `import mlx.core` fails deep in a traceback; a node says in one line what to install."""

from __future__ import annotations

import sys

INSTALL = ("install one of MLX's builds: pip install -e '.[cpu]' (any Linux), '.[cuda13]' (an NVIDIA driver "
           ">= 580) or '.[cuda12]' (>= 550) in the source tree, or swarm[cpu] / swarm[cuda13] from a package; "
           "scripts/install.sh picks the right one")


def missing_mlx_build() -> str | None:
    """The line to print when MLX cannot be imported, else None."""
    try:
        import mlx.core  # noqa: F401
    except ImportError as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        if sys.platform == "darwin":
            return f"MLX cannot be imported ({why}): pip install -e . (MLX's Metal build) or scripts/install.sh"
        return f"MLX's native library cannot be loaded ({why}): {INSTALL}"
    return None
