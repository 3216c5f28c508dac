"""Rebuild a Hugging Face fast tokenizer from the vocabulary stored in a GGUF.

Only GPT-2 style byte-level BPE (`tokenizer.ggml.model == "gpt2"`) is handled;
that is what SmolLM2 and most llama-architecture GGUFs with a BPE vocab carry.
"""

import json
from pathlib import Path
from typing import Any, Mapping

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from .errors import ModelFormatError

_SPECIAL_TYPE = 3  # llama.cpp token type CONTROL

# llama.cpp's `tokenizer.ggml.pre` names the pre-tokenizer regex it was
# converted with. SmolLM2 ("smollm") splits every digit on its own before the
# GPT-2 byte-level split, exactly like its Hugging Face tokenizer.json.
_PRE_TOKENIZERS = {
    "smollm": lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ),
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "default": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
}


def _scalar(value: Any) -> Any:
    """GGUF scalars come back from mx.load as 0-d mx.arrays."""
    return value.item() if hasattr(value, "item") else value


def build_tokenizer(meta: Mapping[str, Any]) -> Tokenizer:
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ModelFormatError(
            f"unsupported GGUF tokenizer model {meta.get('tokenizer.ggml.model')!r}"
            " (only byte-level BPE 'gpt2' is supported)"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ModelFormatError(f"unsupported GGUF pre-tokenizer {pre!r}")

    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelFormatError("GGUF vocabulary has duplicate tokens")
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    if any(len(m) != 2 for m in merges):
        raise ModelFormatError("GGUF merges are not 'left right' pairs")

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in special_ids(meta)]
    )
    return tok


def special_ids(meta: Mapping[str, Any]) -> list[int]:
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        return []
    return [i for i, t in enumerate(types.tolist()) if t == _SPECIAL_TYPE]


# Hugging Face role -> GGUF metadata key holding its id.
_ROLE_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
}


def _token_id(meta: Mapping[str, Any], role: str) -> int | None:
    idx = meta.get(_ROLE_KEYS[role])
    return None if idx is None else int(_scalar(idx))


def write_tokenizer(meta: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json.

    Returns the special token ids for config.json.
    """
    out_dir = Path(out_dir)
    build_tokenizer(meta).save(str(out_dir / "tokenizer.json"))

    tokens = meta["tokenizer.ggml.tokens"]
    ids = {role: _token_id(meta, role) for role in _ROLE_KEYS}
    ids = {role: i for role, i in ids.items() if i is not None}
    specials = {f"{role}_token": tokens[i] for role, i in ids.items()}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": bool(_scalar(meta.get("tokenizer.ggml.add_bos_token", False))),
        "add_prefix_space": False,
        # Cleanup would rewrite " ." to "." and break exact round-trips.
        "clean_up_tokenization_spaces": False,
    }
    arch = meta.get("general.architecture", "llama")
    if (ctx := meta.get(f"{arch}.context_length")) is not None:
        config["model_max_length"] = _scalar(ctx)
    if template := meta.get("tokenizer.chat_template"):
        config["chat_template"] = template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, ensure_ascii=False))
    return {f"{role}_token_id": i for role, i in ids.items() if role != "unk"}
