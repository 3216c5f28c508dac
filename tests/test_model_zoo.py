"""The model zoo: tiny deterministic random-weight models of mlx-lm families.

Checked in depth on llama / qwen2 / qwen3 (the families other tests lean on);
every family of the zoo is built and run by test_model_families.py."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm import generate
from mlx_lm.generate import generate_step
from mlx_lm.utils import load

from model_zoo import build_random_model, main

FAMILIES = ["llama", "qwen2", "qwen3"]

TEXTS = [
    "Hello, world!",
    "12345 and 3.14159",
    "  spaces   and\ttabs\n\nnewlines\n",
    "naïve café 日本語 🙂👍🏽",
    "def f(x):\n    return x ** 2  # square",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory) -> tuple[str, Path]:
    family = request.param
    return family, build_random_model(tmp_path_factory.mktemp(family), family)


@pytest.fixture(scope="module")
def loaded(family_dir):
    return load(str(family_dir[1]))


def test_loads_as_its_family(family_dir, loaded):
    family, path = family_dir
    model, _ = loaded
    assert json.loads((path / "config.json").read_text())["model_type"] == family
    assert model.model_type == family and len(model.layers) == 6
    params = dict(tree_flatten(model.parameters()))
    assert {v.dtype for v in params.values()} == {mx.float32}
    attn = "model.layers.0.self_attn"
    assert (f"{attn}.q_proj.bias" in params) == (family == "qwen2")
    assert (f"{attn}.q_norm.weight" in params) == (family == "qwen3")
    assert "lm_head.weight" not in params  # tied by default


def test_greedy_output_is_not_one_repeated_token(loaded):
    model, tokenizer = loaded
    for prompt in ("Once upon a time", "def f(x):"):
        # generate_step does not stop at eos, so we always see 20 tokens.
        tokens = [t for t, _ in generate_step(mx.array(tokenizer.encode(prompt)), model, max_tokens=20)]
        assert len(tokens) == 20
        assert len(set(tokens)) >= 3, tokens
    assert isinstance(generate(model, tokenizer, "Once upon a time", max_tokens=5), str)


def test_same_args_give_identical_files(family_dir, tmp_path):
    family, first = family_dir
    again = build_random_model(tmp_path / "again", family)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (first / name).read_bytes(), name
    other = build_random_model(tmp_path / "other", family, seed=1)
    assert (other / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trips(loaded, text):
    _, tokenizer = loaded
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_and_chat_template(loaded):
    _, tokenizer = loaded
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert len(tokenizer.encode(token)) == 1
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_ids == {tokenizer.encode("<|im_end|>")[0]}
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_untied_model_has_its_own_head(tmp_path):
    path = build_random_model(tmp_path / "m", "qwen3", n_layers=2, tie_embeddings=False)
    model, _ = load(str(path))
    params = dict(tree_flatten(model.parameters()))
    assert params["lm_head.weight"].shape == params["model.embed_tokens.weight"].shape


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="family"):
        build_random_model(tmp_path / "m", "no_such_family")
    with pytest.raises(ValueError, match="vocab"):
        build_random_model(tmp_path / "m", "llama", vocab=10)
    assert not (tmp_path / "m").exists()


def test_command_line(tmp_path, capsys):
    main([str(tmp_path / "cli"), "--family", "qwen2", "--layers", "2", "--seed", "3"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    model, _ = load(str(tmp_path / "cli"))
    assert model.model_type == "qwen2" and len(model.layers) == 2


@pytest.mark.parametrize("kind, bits", [("4bit", {4}), ("8bit", {8}), ("mixed", {4, 8})])
def test_quantized_models_load_with_their_bits(tmp_path, kind, bits):
    path = build_random_model(tmp_path / kind, "qwen3", n_layers=3, quantize=kind)
    config = json.loads((path / "config.json").read_text())
    model, _ = load(str(path))
    got = {m.bits for _, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    assert got == bits and "quantization" in config


@pytest.mark.parametrize("family, key", [("gpt2", "n_layer"), ("gpt_bigcode", "n_layer"), ("exaone", "num_layers"),
                                         ("openelm", "num_transformer_layers")])
def test_families_name_their_layer_count_their_own_way_and_resolve(tmp_path, family, key):
    from swarm.models.resolve import resolve_model
    path = build_random_model(tmp_path / family, family)
    config = json.loads((path / "config.json").read_text())
    assert key in config and "num_hidden_layers" not in config
    assert resolve_model(str(path)).n_layers == 6
