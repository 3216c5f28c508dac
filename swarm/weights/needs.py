"""Which chunks of a model a stage needs: the tensors its shard keeps, and what every node needs.

The shard itself says which tensors it keeps (engine/shard.py: its layers, plus the
embedding, norm, head or anything else its position in the pipeline reads), so a
stage fetches exactly those. Building the shard lazily reads only the weight files'
headers, which a fetching node holds first.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

from ..engine import families
from ..engine.model_outline import outline
from ..engine.shard import LayerRange, Shard
from ..models.manifest import Chunk, Manifest

log = logging.getLogger(__name__)


def stage_tensor_names(model_dir: Path, start: int, end: int) -> set[str]:
    """The checkpoint tensors the shard of layers [start, end) keeps (MLX thread: builds MLX modules)."""
    model, _ = load_model(Path(model_dir), lazy=True, strict=True)
    family = families.family_of(model)
    n_layers = len(model.layers)
    shard = Shard(model, LayerRange(start, end, n_layers), outline(model, family), family)
    return {name for name, _ in tree_flatten(shard.model.parameters())}


def stage_chunks(manifest: Manifest, tensor_names: set[str]) -> list[Chunk]:
    """The stage's tensors' chunks plus the support chunks (configs, tokenizer, weight headers).

    Tensors the model holds under names that are not the checkpoint's (a family whose loader
    renames or stacks weights) cannot be mapped: then the whole model is fetched, and said so."""
    known = manifest.tensor_names()
    if not tensor_names <= known:
        missing = sorted(tensor_names - known)[:3]
        log.warning("this model's parameters are not named as in its files (%s, ...): fetching all of it", missing)
        return list(manifest.chunks)
    return manifest.support_chunks() + manifest.tensor_chunks(tensor_names)
