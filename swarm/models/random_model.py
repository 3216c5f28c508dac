"""Deterministic random-weight tiny models (llama / qwen2 / qwen3) for tests.

Every tensor is drawn from a numpy RNG seeded by (seed, tensor name), so the
same arguments always give byte-identical weights, independent of the order
in which mlx lists parameters. The tokenizer is a small byte-level BPE trained
on a built-in corpus, so any text round-trips without any download.
"""

import argparse
import importlib
import json
import zlib
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

Family = Literal["llama", "qwen2", "qwen3"]
FAMILIES: tuple[str, ...] = ("llama", "qwen2", "qwen3")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A swarm of small machines can share
one large model: each peer holds a few layers and passes activations to the next.
Once upon a time, there was a little robot who loved to count: 0 1 2 3 4 5 6 7 8 9.
She asked, "Where does the river go?" He answered, 'To the sea, of course!'
def forward(self, x):
    return self.proj(x) + x  # residual connection
for i in range(10): print(i * i, end=", ")
{"role": "user", "content": "What is the capital of France?"}
The answer is Paris. Numbers like 3.14159, 2024 and 1,000,000 appear in text too.
Tokens, layers, heads, keys, values, queries, embeddings, logits and probabilities.
"""


def build_tokenizer(vocab_size: int = 384) -> Tokenizer:
    """Byte-level BPE: the 256-byte alphabet guarantees exact round-trips."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return tok


def model_config(
    family: Family, *, n_layers: int, hidden: int, heads: int, kv_heads: int,
    intermediate: int, vocab: int, tie_embeddings: bool, eos_token_id: int,
) -> dict[str, Any]:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, not {family!r}")
    config: dict[str, Any] = {
        "model_type": family,
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0 if family == "llama" else 1000000.0,
        "tie_word_embeddings": tie_embeddings,
        "hidden_act": "silu",
        "eos_token_id": eos_token_id,
    }
    if family == "qwen2":
        del config["head_dim"]  # qwen2 derives it; q/k/v carry a bias by design
    return config


def _init(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith("norm.weight"):
        return np.ones(shape, np.float32)
    if name.endswith(".bias"):
        return rng.normal(0.0, 0.02, shape).astype(np.float32)
    # Scales chosen so greedy decoding wanders instead of looping:
    # - small embeddings, else the tied head echoes the last token forever;
    # - damped attention output, else the context average dominates and the
    #   prediction freezes; the MLP then acts as a random next-token map.
    if "embed_tokens" in name:
        std = 0.02
    elif "o_proj" in name:
        std = 0.2 * shape[-1] ** -0.5
    else:
        std = shape[-1] ** -0.5  # variance-preserving
    return rng.normal(0.0, std, shape).astype(np.float32)


def random_weights(config: dict[str, Any], seed: int) -> dict[str, mx.array]:
    """Shapes come from the real mlx-lm module, so the names always load."""
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    shapes = {name: tuple(p.shape) for name, p in tree_flatten(model.parameters())}
    return {name: mx.array(_init(name, shape, seed)) for name, shape in sorted(shapes.items())}


def build_random_model(
    out_dir: str | Path,
    family: Family = "llama",
    *,
    n_layers: int = 6,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    vocab: int | None = None,
    seed: int = 0,
    tie_embeddings: bool = True,
) -> Path:
    """Write an mlx-lm model directory loadable with mlx_lm.utils.load."""
    tokenizer = build_tokenizer()
    vocab = vocab or tokenizer.get_vocab_size()
    if vocab < tokenizer.get_vocab_size():
        raise ValueError(f"vocab {vocab} is smaller than the tokenizer's {tokenizer.get_vocab_size()}")
    eos_id = tokenizer.token_to_id("<|im_end|>")
    config = model_config(
        family, n_layers=n_layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        intermediate=intermediate, vocab=vocab, tie_embeddings=tie_embeddings, eos_token_id=eos_id,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), random_weights(config, seed), {"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer(tokenizer, out_dir)
    return out_dir


def _write_tokenizer(tokenizer: Tokenizer, out_dir: Path) -> None:
    tokenizer.save(str(out_dir / "tokenizer.json"))
    specials = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,  # keeps decode(encode(s)) == s
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a tiny random-weight mlx-lm model.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--family", choices=FAMILIES, default="llama")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--untied", action="store_true", help="separate lm_head weights")
    args = parser.parse_args(argv)
    path = build_random_model(
        args.out_dir, args.family, n_layers=args.layers, hidden=args.hidden, heads=args.heads,
        kv_heads=args.kv_heads, intermediate=args.intermediate, seed=args.seed,
        tie_embeddings=not args.untied,
    )
    print(path)


if __name__ == "__main__":
    main()
