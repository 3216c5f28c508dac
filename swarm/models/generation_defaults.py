"""Sampling defaults for request fields a client leaves out.

In order: the node's own flags (`--temperature`, `--top-p`, `--top-k`), the model's
`generation_config.json` (what its authors recommend, as vLLM takes it; Hugging
Face's `do_sample: false` means greedy), else greedy, as mlx-lm's server does: a
small model sampled at temperature 1 rambles for hundreds of tokens.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationDefaults:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    source: str = "greedy"  # where they came from, for the log

    def describe(self) -> str:
        return (f"temperature {self.temperature:g}, top_p {self.top_p:g}, top_k {self.top_k}, "
                f"repetition_penalty {self.repetition_penalty:g} ({self.source})")


def generation_defaults(model_dir: Path, temperature: float | None = None, top_p: float | None = None,
                        top_k: int | None = None) -> GenerationDefaults:
    config = _read(Path(model_dir) / "generation_config.json")
    fields: dict = {}
    if config:
        if config.get("do_sample") is False:
            fields["temperature"] = 0.0
        elif _number(config.get("temperature"), 0, 2):
            fields["temperature"] = float(config["temperature"])
        if _number(config.get("top_p"), 0, 1) and config["top_p"] > 0:
            fields["top_p"] = float(config["top_p"])
        if isinstance(config.get("top_k"), int) and not isinstance(config["top_k"], bool) and config["top_k"] >= 0:
            fields["top_k"] = config["top_k"]
        if _number(config.get("repetition_penalty"), 0, 10) and config["repetition_penalty"] > 0:
            fields["repetition_penalty"] = float(config["repetition_penalty"])
    sources = ["generation_config.json"] if fields else []
    flags = {k: v for k, v in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k)) if v is not None}
    if flags:
        sources.insert(0, "node flags")
    fields.update(flags)
    return GenerationDefaults(**fields, source=" over ".join(sources) or "greedy: no generation_config.json")


def _read(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        log.warning("ignoring %s: %s", path, e)
        return None
    return config if isinstance(config, dict) else None


def _number(v, lo: float, hi: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
