"""What the last-stage benchmarks (constrained_sampling.py) set up:
their arguments, the model, its tokenizer and the JSON-describing prompt they decode from."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlx_lm.utils import load_tokenizer


def parse_args(description: str, tokens: int) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default=None, help="model directory (default: the built-in default model)")
    p.add_argument("--tokens", type=int, default=tokens)
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


def model_and_prompt(model: str | None):
    """(model directory, tokenizer, prompt token ids)."""
    if model is None:
        from swarm.models.resolve import resolve_model
        model_dir = resolve_model(None).path
    else:
        model_dir = Path(model)
    tokenizer = load_tokenizer(model_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Describe a person in JSON."}],
                                           add_generation_prompt=True)
    return model_dir, tokenizer, prompt
