"""What one machine produces: greedy tokens from mlx-lm on the whole model, in this process."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model, load_tokenizer


@lru_cache(maxsize=4)
def _load(model_dir: str):
    model, config = load_model(Path(model_dir))
    return model, load_tokenizer(Path(model_dir), eos_token_ids=config.get("eos_token_id"))


def reference_chat(model_dir, messages: list[dict], max_tokens: int) -> tuple[str, int]:
    """(text, completion tokens) of a greedy chat completion, stopping at end-of-sequence."""
    model, tok = _load(str(model_dir))
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    tokens = []
    for (t, _), _ in zip(generate_step(mx.array(prompt), model, max_tokens=max_tokens), range(max_tokens)):
        tokens.append(int(t))
        if int(t) in tok.eos_token_ids:
            break
    text_tokens = tokens[:-1] if tokens and tokens[-1] in tok.eos_token_ids else tokens
    return tok.decode(text_tokens), len(tokens)
