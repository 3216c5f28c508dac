"""Where swarm keeps derived artefacts such as converted models."""

from pathlib import Path

from .. import environment


def default_cache_root() -> Path:
    """$SWARM_CACHE_DIR, else $XDG_CACHE_HOME/swarm, else ~/.cache/swarm."""
    if explicit := environment.CACHE_DIR.get():
        return Path(explicit).expanduser()
    if xdg := environment.XDG_CACHE_HOME.get():
        return Path(xdg).expanduser() / "swarm"
    return Path.home() / ".cache" / "swarm"
