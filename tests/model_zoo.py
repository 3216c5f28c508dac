"""Deterministic random-weight tiny models of any mlx-lm family, for tests.

Every tensor is drawn from a numpy RNG seeded by (seed, tensor name), so the
same arguments always give byte-identical weights, independent of the order
in which mlx lists parameters. Shapes come from the real mlx-lm module built
from the family's tiny config (model_zoo_configs.py), so the names always
load. The tokenizer is a small byte-level BPE trained on a built-in corpus:
any text round-trips without a download, and a real `swarm-node` serves the
model like any other (chat template included).

`python tests/model_zoo.py OUT_DIR --family gpt_oss` writes one from the shell.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_zoo_configs import DROP, FAMILIES as _CONFIGS, Shape, base  # noqa: E402

FAMILIES: tuple[str, ...] = tuple(_CONFIGS)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen 2.5's chat template (it renders tools): mlx-lm picks its json_tools parser for it
# (tokenizer_utils._infer_tool_parser), and <tool_call> / </tool_call> are tokens, as in Qwen's vocabulary.
TOOLS_CHAT_TEMPLATE = "\n".join([
    "{%- if tools %}",
    "{{- '<|im_start|>system\\n' }}",
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}",
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}",
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}",
    "{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}",
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}",
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within ' }}",
    "{{- '<tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}",
    "{{- '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}",
    "{%- else %}",
    "{%- if messages[0]['role'] == 'system' %}",
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}",
    "{%- endif %}",
    "{%- endif %}",
    "{%- for message in messages %}",
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}",
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
    "{%- elif message.role == 'assistant' %}",
    "{{- '<|im_start|>' + message.role }}",
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}",
    "{%- for tool_call in message.tool_calls %}",
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}",
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}",
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}",
    "{%- endfor %}",
    "{{- '<|im_end|>\\n' }}",
    "{%- elif message.role == 'tool' %}",
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}",
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}",
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}",
    "{%- endif %}",
    "{%- endfor %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
])
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]
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

# Quantization recipes: mlx-lm's own config format ("quantization" in config.json).
QUANTIZATIONS = ("4bit", "8bit", "mixed")


@lru_cache(maxsize=1)
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


def model_config(family: str, shape: Shape, eos_token_id: int) -> dict[str, Any]:
    if family not in _CONFIGS:
        raise ValueError(f"family must be one of {FAMILIES}, not {family!r}")
    config = {"model_type": family, **base(shape), "eos_token_id": eos_token_id, **_CONFIGS[family](shape)}
    return {k: v for k, v in config.items() if v is not DROP}


def model_classes(config: dict[str, Any]):
    from mlx_lm.utils import _get_classes
    return _get_classes(config)


# What each family calls the attention output projection (damped, see _init).
_OUTPUT_PROJECTIONS = {"o_proj", "out_proj", "dense", "wo", "c_proj", "o"}


def _init(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    leaf = name.rsplit(".", 1)[-1]
    if len(shape) == 1 and leaf == "weight":  # norm scales
        return np.ones(shape, np.float32)
    if len(shape) <= 1 or leaf == "bias" or leaf.endswith("_bias"):
        return rng.normal(0.0, 0.02, shape).astype(np.float32)
    # Scales chosen so greedy decoding wanders instead of looping:
    # - small embeddings, else the tied head echoes the last token forever;
    # - damped attention output, else the context average dominates and the
    #   prediction freezes; the MLP then acts as a random next-token map.
    lowered = name.lower()
    if "embed" in lowered or "wte" in lowered or "wpe" in lowered or lowered.startswith("emb"):
        std = 0.02
    elif leaf in ("weight", "scales") and name.split(".")[-2] in _OUTPUT_PROJECTIONS:
        std = 0.2 * shape[-1] ** -0.5
    else:
        std = shape[-1] ** -0.5  # variance-preserving
    return rng.normal(0.0, std, shape).astype(np.float32)


def random_model(config: dict[str, Any], seed: int) -> nn.Module:
    """The family's mlx-lm Model with deterministic random weights."""
    model_class, args_class = model_classes(config)
    model = model_class(args_class.from_dict(config))
    params = tree_flatten(model.parameters())
    weights = [(name, mx.array(_init(name, tuple(p.shape), seed)).astype(p.dtype)
                if mx.issubdtype(p.dtype, mx.floating) else p) for name, p in params]
    model.load_weights(weights)
    return model


def build_random_model(
    out_dir: str | Path,
    family: str = "llama",
    *,
    n_layers: int = 6,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    vocab: int | None = None,
    seed: int = 0,
    tie_embeddings: bool = True,
    quantize: str | None = None,
    tools_template: bool = False,
) -> Path:
    """Write an mlx-lm model directory loadable with mlx_lm.utils.load.

    `quantize`: "4bit" / "8bit" (affine, group 32), or "mixed" (mlx-lm's per-layer
    format: 8-bit first and last layers and attention value projections, 4-bit the rest).
    `tools_template`: a chat template that renders tools (TOOLS_CHAT_TEMPLATE) and the
    tool-call markers as tokens of their own.
    """
    from mlx_lm.utils import quantize_model, save_config, save_model

    tokenizer = build_tokenizer()
    if tools_template:
        tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a copy: build_tokenizer's is shared
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    vocab = vocab or tokenizer.get_vocab_size()
    if vocab < tokenizer.get_vocab_size():
        raise ValueError(f"vocab {vocab} is smaller than the tokenizer's {tokenizer.get_vocab_size()}")
    shape = Shape(n_layers=n_layers, hidden=hidden, heads=heads, kv_heads=kv_heads, intermediate=intermediate,
                  vocab=vocab, tie=tie_embeddings)
    config = model_config(family, shape, eos_token_id=tokenizer.token_to_id("<|im_end|>"))
    model = random_model(config, seed)
    if quantize is not None:
        model, config = quantize_model(model, config, *_quantization(quantize, n_layers))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_model(out_dir, model)
    save_config(config, out_dir / "config.json")
    _write_tokenizer(tokenizer, out_dir, TOOLS_CHAT_TEMPLATE if tools_template else CHAT_TEMPLATE)
    return out_dir


def _quantization(kind: str, n_layers: int) -> tuple:
    if kind not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {QUANTIZATIONS}, not {kind!r}")
    if kind != "mixed":
        return 32, int(kind[0])

    def predicate(path: str, module: nn.Module):
        edge = any(f"layers.{i}." in path for i in (0, n_layers - 1))
        return {"group_size": 32, "bits": 8 if edge or "v_proj" in path or "lm_head" in path else 4,
                "mode": "affine"}
    return 32, 4, "affine", False, predicate


def _write_tokenizer(tokenizer: Tokenizer, out_dir: Path, chat_template: str = CHAT_TEMPLATE) -> None:
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
        "chat_template": chat_template,
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
    parser.add_argument("--quantize", choices=QUANTIZATIONS)
    args = parser.parse_args(argv)
    path = build_random_model(
        args.out_dir, args.family, n_layers=args.layers, hidden=args.hidden, heads=args.heads,
        kv_heads=args.kv_heads, intermediate=args.intermediate, seed=args.seed,
        tie_embeddings=not args.untied, quantize=args.quantize,
    )
    print(path)


if __name__ == "__main__":
    main()
