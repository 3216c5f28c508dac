"""Where swarm keeps derived artefacts such as converted models."""

import os
from pathlib import Path


def default_cache_root() -> Path:
    """$SWARM_CACHE_DIR, else $XDG_CACHE_HOME/swarm, else ~/.cache/swarm."""
    if explicit := os.environ.get("SWARM_CACHE_DIR"):
        return Path(explicit).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "swarm"
    return Path.home() / ".cache" / "swarm"
