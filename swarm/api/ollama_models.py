"""The swarm's one model as Ollama's clients see it: its names, and /api/tags, /api/show, /api/ps.

Ollama names a model `name:tag`. The swarm's model answers to its id (`SmolLM2-135M-Instruct`,
`mlx-community/Qwen3-4B-4bit`), to the last part of an id with a slash (`Qwen3-4B-4bit`),
each with or without the `:latest` tag, in any case. /api/tags lists it as `<id>:latest`.
"""

from __future__ import annotations

import json
import struct
from datetime import datetime, timezone
from pathlib import Path

from ..models.resolve import LocalModel
from .errors import ApiError

TAG = "latest"
OLLAMA_VERSION = "0.12.0"  # the Ollama API this face follows (clients gate features on it)
_FAR_FUTURE = "2999-01-01T00:00:00Z"  # /api/ps: the swarm never unloads its model


class OllamaModel:
    def __init__(self, model_id: str, local: LocalModel | None = None, chat_template: str | None = None):
        self.model_id, self.local, self.chat_template = model_id, local, chat_template
        self.name = model_id if ":" in model_id.rsplit("/", 1)[-1] else f"{model_id}:{TAG}"
        self._accepted = {_plain(model_id), _plain(model_id.rsplit("/", 1)[-1])}
        self._facts: dict | None = None

    def check(self, name: str) -> None:
        """404 in Ollama's words for a name that is not the swarm's model."""
        if _plain(name) not in self._accepted:
            raise ApiError(404, f"model '{name}' not found; this swarm serves '{self.name}'", param="model")

    def listed(self) -> dict:
        """One entry of /api/tags."""
        facts = self.facts()
        return {"name": self.name, "model": self.name, "modified_at": facts["modified_at"], "size": facts["size"],
                "digest": facts["digest"], "details": self.details()}

    def running(self, context_length: int) -> dict:
        """One entry of /api/ps."""
        return {**self.listed(), "expires_at": _FAR_FUTURE, "size_vram": 0, "context_length": context_length}

    def shown(self, context_length: int, parameters: str) -> dict:
        """/api/show."""
        facts, config = self.facts(), self._config()
        arch = config.get("model_type") or "unknown"
        info = {"general.architecture": arch, "general.parameter_count": facts["parameters"],
                "general.basename": self.model_id.rsplit("/", 1)[-1], f"{arch}.context_length": context_length}
        for key, ours in (("block_count", "num_hidden_layers"), ("embedding_length", "hidden_size"),
                          ("attention.head_count", "num_attention_heads"),
                          ("attention.head_count_kv", "num_key_value_heads"), ("vocab_size", "vocab_size")):
            if isinstance(config.get(ours), int):
                info[f"{arch}.{key}"] = config[ours]
        return {"license": "", "modelfile": f"FROM {self.name}\n", "parameters": parameters,
                "template": self.chat_template or "", "details": self.details(), "model_info": info,
                "capabilities": ["completion", "tools"], "modified_at": facts["modified_at"]}

    def details(self) -> dict:
        config, facts = self._config(), self.facts()
        family = config.get("model_type") or "unknown"
        return {"parent_model": "", "format": "safetensors", "family": family, "families": [family],
                "parameter_size": _count(facts["parameters"]), "quantization_level": facts["quantization"]}

    def facts(self) -> dict:
        """Size, digest, parameter count and number format, read once from the weight files' headers."""
        if self._facts is None:
            local = self.local
            path = local.path if local else None
            bits = (self._config().get("quantization") or {}).get("bits")
            parameters, dtype = _weights(path, bits) if path else (0, "unknown")
            self._facts = {
                "size": local.manifest.total_bytes if local else 0,
                "digest": local.fingerprint if local else "",
                "modified_at": _iso(path.stat().st_mtime) if path else _iso(0),
                "parameters": parameters,
                "quantization": f"Q{bits}" if bits else dtype}
        return self._facts

    def _config(self) -> dict:
        return self.local.config if self.local else {}


def _plain(name: str) -> str:
    name = name.strip().lower()
    return name[:-len(f":{TAG}")] if name.endswith(f":{TAG}") else name


def _weights(path: Path, bits: int | None) -> tuple[int, str]:
    """The parameter count (quantized weights unpacked from their 32-bit words) and the commonest type."""
    total, by_type = 0, {}
    for file in sorted(path.glob("model*.safetensors")):
        try:
            with open(file, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
        except (OSError, ValueError, struct.error):
            continue
        for name, tensor in header.items():
            if name == "__metadata__" or name.endswith((".scales", ".biases")):
                continue
            count = 1
            for d in tensor.get("shape", []):
                count *= d
            if bits and tensor.get("dtype") == "U32":
                count = count * 32 // bits
            total += count
            by_type[tensor.get("dtype")] = by_type.get(tensor.get("dtype"), 0) + count
    dtype = max(by_type, key=by_type.get) if by_type else "unknown"
    return total, str(dtype)


def _count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}".rstrip("0").rstrip(".") + unit
    return str(n)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
