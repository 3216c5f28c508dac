"""Hugging Face repo ids (`mlx-community/Qwen3-4B-4bit`) found in the local Hugging Face cache.

The lookup is huggingface_hub's own offline one (what mlx-lm's tools do with
HF_HUB_OFFLINE set): the cache is HF_HUB_CACHE, else HF_HOME/hub, else
~/.cache/huggingface/hub, and a repo's current snapshot is the commit its
refs/main names. Nothing is downloaded: a node never reaches out to the hub.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import ModelNotFoundError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_repo_id(spec: str) -> bool:
    return bool(_REPO_ID.match(spec)) and not spec.startswith((".", "/", "~"))


def hub_cache_dir() -> str:
    """Where huggingface_hub looks for cached repos (HF_HUB_CACHE, else HF_HOME/hub, else the default)."""
    from huggingface_hub import constants
    return str(constants.HF_HUB_CACHE)


def cached_repo(repo_id: str) -> Path:
    """The local snapshot directory of `repo_id`; ModelNotFoundError if it is not cached."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError) as e:
        cache = constants.HF_HUB_CACHE
        raise ModelNotFoundError(
            f"model not found: {repo_id} is no local path and not in the local Hugging Face cache "
            f"({cache}); nodes never download: fetch it first (e.g. `huggingface-cli download {repo_id}`) "
            f"or give a model directory") from e
