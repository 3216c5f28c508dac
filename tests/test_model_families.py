"""Every mlx-lm family the zoo builds splits exactly, or is refused at load with its reason.

For each family: a tiny random model (tests/model_zoo_configs.py) split 1-, 2- and
3-way unevenly, each with its own prefill chunking, generates greedily through
ShardRunners chained in this process; tokens and log-probabilities must equal
mlx-lm running the whole model on the same chunks. Prompt plus generation (52
positions) runs past every sliding window (8), so windowed families use their
rotating caches and per-layer masks for real. The 1-way run uses mlx_lm.generate's
own schedule (prompt[:-1], then the last token) and must also equal
mlx_lm.generate_step token for token.

Families the engine refuses must be refused by the table (engine/families.py)
*and* by the dry run alone, so a new family of the same kind is refused too.
"""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import dequantize_model, load_model
from model_zoo import FAMILIES, build_random_model

from swarm.engine import families
from swarm.engine.shard import load_shard
from swarm.engine.shard_runner import ShardRunner
from swarm.models.errors import UnsplittableModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = [(i * 37) % 380 + 3 for i in range(40)]
NEW_TOKENS = 12
# (layers per stage, prefill chunks): 1, 2 and 3 stages, uneven, each with its own chunking.
RUNS = [([6], [39, 1]), ([2, 4], [5, 16, 18, 1]), ([1, 3, 2], [7, 13, 3, 17])]
REFUSED = sorted(families.REFUSED.keys() & set(FAMILIES))
EXACT = [f for f in FAMILIES if f not in families.REFUSED]
QUANTIZED = [("llama", "4bit"), ("mistral", "8bit"), ("qwen3_moe", "4bit"), ("deepseek_v3", "mixed"),
             ("gemma3_text", "4bit"), ("gpt_oss", "mixed"), ("qwen3_next", "8bit")]


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    built: dict[tuple[str, str | None], Path] = {}

    def get(family: str, quantize: str | None = None) -> Path:
        key = (family, quantize)
        if key not in built:
            built[key] = build_random_model(root / f"{family}-{quantize}", family, seed=1, quantize=quantize)
        return built[key]
    return get


def _greedy(run, chunks: list[int]) -> tuple[list[int], list[mx.array]]:
    """Prefill PROMPT in `chunks`, then decode greedily; `run(x, pos)` returns the last logits."""
    assert sum(chunks) == len(PROMPT)
    pos = 0
    for n in chunks:
        logits = run(mx.array([PROMPT[pos:pos + n]]), pos)
        pos += n
    tokens, logprobs = [], []
    for _ in range(NEW_TOKENS):
        logprobs.append(logits - mx.logsumexp(logits))
        tokens.append(int(mx.argmax(logits)))
        logits = run(mx.array([[tokens[-1]]]), pos)
        pos += 1
    return tokens, logprobs


def whole_model(path: Path, chunks: list[int], dequantize: bool = False):
    """mlx-lm on the whole model, fed the same chunks (dequantized by mlx-lm's own dequantize_model)."""
    model, _ = load_model(path)
    if dequantize:
        model = dequantize_model(model)
    cache = make_prompt_cache(model)

    def run(x, pos):
        out = model(x, cache=cache)[0, -1]
        mx.eval(out)
        return out
    return _greedy(run, chunks)


def split_model(path: Path, sizes: list[int], chunks: list[int], dequantize: bool = False):
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    runners = [ShardRunner(load_shard(path, a, b, dequantize_layers=dequantize)) for a, b in zip(bounds, bounds[1:])]

    def run(x, pos):
        for runner in runners:
            x = runner.forward("r", x, pos)
        return x
    return _greedy(run, chunks)


def assert_same(got, want, what: str) -> None:
    tokens, logprobs = got
    want_tokens, want_logprobs = want
    assert tokens == want_tokens, what
    worst = max(float(mx.max(mx.abs(a - b))) for a, b in zip(logprobs, want_logprobs))
    assert worst < 1e-4, f"{what}: log-probabilities differ by {worst}"


@pytest.mark.parametrize("family", EXACT)
def test_family_splits_exactly(zoo, family):
    path = zoo(family)
    model, _ = load_model(path)
    generated = [int(t) for (t, _), _ in zip(generate_step(mx.array(PROMPT), model, max_tokens=NEW_TOKENS),
                                              range(NEW_TOKENS))]
    assert len(set(generated)) >= 2, f"the {family} test model repeats one token: {generated}"
    for sizes, chunks in RUNS:
        want = whole_model(path, chunks)
        if chunks == RUNS[0][1]:
            assert want[0] == generated, "the reference loop must be mlx_lm.generate's"
        assert_same(split_model(path, sizes, chunks), want, f"{family} split {sizes}, chunks {chunks}")


@pytest.mark.parametrize("family, quantize", QUANTIZED)
def test_quantized_family_splits_exactly(zoo, family, quantize):
    """Kept quantized (Metal's default, a CPU node's --dequantize no) and dequantized at load (a CPU
    node's default): either way the split equals mlx-lm on the whole model with the same weights."""
    path = zoo(family, quantize)
    for (sizes, chunks), dequantize in zip(RUNS[1:], (False, True)):
        assert_same(split_model(path, sizes, chunks, dequantize), whole_model(path, chunks, dequantize),
                    f"{family} {quantize} split {sizes}, dequantized: {dequantize}")


def _layer_bytes(path: Path) -> list[int]:
    model, _ = load_model(path, lazy=True)
    return [sum(v.nbytes for _, v in tree_flatten(layer.parameters())) for layer in model.layers]


@pytest.mark.parametrize("family", EXACT)
def test_a_middle_shard_holds_its_layers_and_little_else(zoo, family):
    path = zoo(family)
    per_layer = _layer_bytes(path)
    shard = load_shard(path, 2, 4)
    extra = shard.weight_bytes() - sum(per_layer[2:4])
    # Beyond its own layers a middle shard may keep small things read before the layers
    # (an embedding norm), never an embedding or a head.
    assert 0 <= extra <= 0.02 * sum(per_layer), f"{family}: a middle shard holds {extra} bytes beyond its layers"


@pytest.mark.parametrize("family", REFUSED)
def test_family_is_refused_with_its_reason(zoo, family, monkeypatch):
    path = zoo(family)
    with pytest.raises(UnsplittableModel) as refused:
        load_shard(path, 0, 3)
    message = str(refused.value)
    assert message.startswith(f"{family}: cannot be split") and families.REFUSED[family] in message
    assert "\n" not in message
    # Without the table, the dry run refuses it too (a new family of this kind is caught).
    monkeypatch.setattr(families, "REFUSED", {})
    with pytest.raises(UnsplittableModel, match=f"^{family}: "):
        load_shard(path, 0, 3)


def test_the_zoo_covers_at_least_forty_families():
    assert len(EXACT) >= 40 and len(REFUSED) >= 5
