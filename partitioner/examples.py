"""Realistic swarms for docs/partitioning.md (rendered by `python -m partitioner --examples`)."""

from __future__ import annotations

from dataclasses import dataclass

from .model import ModelSpec, NodeCapacity

MB, GB = 10**6, 10**9


@dataclass(frozen=True)
class Example:
    title: str
    model_name: str
    model: ModelSpec
    nodes: tuple[NodeCapacity, ...]


def smollm2_135m(context_tokens: int = 2048) -> ModelSpec:
    """SmolLM2-135M in float32, bytes derived from its shape."""
    hidden, intermediate, kv_heads, head_dim, vocab, dtype = 576, 1536, 3, 64, 49152, 4
    kv_dim = kv_heads * head_dim
    per_layer = (
        2 * hidden * hidden  # q, o
        + 2 * hidden * kv_dim  # k, v
        + 3 * hidden * intermediate  # gate, up, down
        + 2 * hidden  # two RMSNorms
    )
    embedding = vocab * hidden * dtype
    return ModelSpec(
        n_layers=30,
        bytes_per_layer=per_layer * dtype,
        embedding_bytes=embedding,
        head_bytes=hidden * dtype + embedding,  # final norm + its own copy of the tied matrix
        kv_bytes_per_token_per_layer=2 * kv_dim * dtype,
        context_tokens=context_tokens,
    )


def deepseek_v3_4bit(context_tokens: int = 8192) -> ModelSpec:
    """A DeepSeek-V3-class model at 4-bit (4.5 bits with group scales), ~380 GB."""
    hidden, vocab, bits = 7168, 129280, 4.5
    embedding = int(vocab * hidden * bits / 8)
    head = embedding + hidden * 2
    n_layers, total = 61, 380 * GB
    return ModelSpec(
        n_layers=n_layers,
        bytes_per_layer=(total - embedding - head) // n_layers,
        embedding_bytes=embedding,
        head_bytes=head,
        kv_bytes_per_token_per_layer=(512 + 64) * 2,  # MLA: compressed KV + rope key, bf16
        context_tokens=context_tokens,
    )


def _studios(count: int, usable: int) -> tuple[NodeCapacity, ...]:
    # Two of the eight are slower M2 Max machines; 1 ms per hop over Thunderbolt.
    return tuple(
        NodeCapacity(f"studio-{i}", usable, 0.0008 if i >= count - 2 else 0.0005, 0.001)
        for i in range(count)
    )


SMOLLM2 = "SmolLM2-135M fp32"

EXAMPLES: tuple[Example, ...] = (
    Example(
        "SmolLM2-135M on one laptop",
        SMOLLM2,
        smollm2_135m(),
        (NodeCapacity("m2-air", 2 * GB, 0.00012, 0.0005),),
    ),
    Example(
        "SmolLM2-135M on a laptop that could hold it alone, plus a Raspberry Pi",
        SMOLLM2,
        smollm2_135m(),
        (
            NodeCapacity("m2-air", 2 * GB, 0.00012, 0.0005),
            NodeCapacity("pi5", 1 * GB, 0.0009, 0.002),
        ),
    ),
    Example(
        "SmolLM2-135M on a laptop with little free memory, plus a Raspberry Pi",
        SMOLLM2,
        smollm2_135m(),
        (
            NodeCapacity("m2-air", 450 * MB, 0.00012, 0.0005),
            NodeCapacity("pi5", 400 * MB, 0.0009, 0.002),
        ),
    ),
    Example(
        "SmolLM2-135M on three nodes, one too small to hold a layer",
        SMOLLM2,
        smollm2_135m(),
        (
            NodeCapacity("m1-mini", 420 * MB, 0.00015, 0.0005),
            NodeCapacity("m2-air", 380 * MB, 0.00012, 0.0005),
            NodeCapacity("pi-zero", 15 * MB, 0.004, 0.004),
        ),
    ),
    Example(
        "DeepSeek-V3-class on 8 x 64 GB, default ~48 GB GPU-wired limit",
        "DeepSeek-V3 4-bit",
        deepseek_v3_4bit(),
        _studios(8, 48 * GB),
    ),
    Example(
        "DeepSeek-V3-class on 8 x 64 GB, wired limit raised to 56 GB",
        "DeepSeek-V3 4-bit",
        deepseek_v3_4bit(),
        _studios(8, 56 * GB),
    ),
)
