"""mlx-lm model families: which ones a swarm refuses to split, and why.

Every other family is split by running its own forward (shard.py), and the
dry run (model_outline.py) refuses at load any whose layers do not form a
plain chain. The families below fail in ways a dry run cannot see, or deserve
a clearer reason than the one it would give; tests/test_model_families.py
checks every family of the installed mlx-lm it can build: exact, or refused.
"""

from __future__ import annotations

import mlx.nn as nn

from ..models.errors import UnsplittableModel

# mlx-lm module -> why its layers cannot be cut into independent contiguous ranges.
REFUSED: dict[str, str] = {
    "gemma3n": "every layer takes per-layer inputs computed from the token ids (AltUp, per-layer "
               "embeddings), and the last layers reuse earlier layers' keys and values",
    "gemma4": "every layer takes per-layer inputs computed from the token ids, and the last layers "
              "reuse earlier layers' keys and values",
    "gemma4_text": "every layer takes per-layer inputs computed from the token ids, and the last layers "
                   "reuse earlier layers' keys and values",
    "hunyuan": "its layers hand keys and values on to the next layer (cross-layer attention)",
    "afm7": "its last layers reuse the keys and values of earlier layers (KV-reuse layers)",
    "rwkv7": "every layer takes the first layer's value projection (v_first) besides its input",
    "talkie": "every block takes the token embeddings besides the previous block's output",
    "iquestloopcoder": "it runs its layer stack twice, the second pass attending to the first pass's "
                       "keys and values",
}


# mlx-lm module -> why a request may not start from another request's kept caches (engine/prompt_cache.py):
# its output depends on how a prompt is cut into pieces, so a prefix computed in other pieces would change
# the text. Such a stage keeps no prompts; its requests run cold. (tests/test_prompt_cache.py checks the
# zoo's families: a family whose pieces matter must be listed, a listed one must still need it.)
PIECES_MATTER: dict[str, str] = {
    "plamo3": "its sliding-window layers give other outputs when a prompt arrives in pieces than in one",
}


def family_of(model: nn.Module) -> str:
    """The mlx-lm module a model's class comes from ("deepseek_v3" also for kimi_k2)."""
    return type(model).__module__.rsplit(".", 1)[-1]


def refuse_unsplittable(family: str) -> None:
    """UnsplittableModel for a family listed in REFUSED, with its reason."""
    if family in REFUSED:
        raise UnsplittableModel(f"{family}: cannot be split into contiguous layer ranges: {REFUSED[family]}")
