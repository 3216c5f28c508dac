"""Realistic swarms for docs/partitioning.md (rendered by `python -m partitioner --examples`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .links import Link
from .model import ModelSpec, NodeCapacity

MB, GB = 10**6, 10**9


@dataclass(frozen=True)
class Example:
    title: str
    model_name: str
    model: ModelSpec
    nodes: tuple[NodeCapacity, ...]
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    links_note: str = ""


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


def deepseek_v3_4bit_per_layer(context_tokens: int = 8192) -> ModelSpec:
    """The same model with each layer's own size: 3 dense layers, then 58 with 256 experts.

    Parameters per layer from its shape (hidden 7168, MLA attention 187M, dense MLP
    3 x 7168 x 18432, experts 256 x 3 x 7168 x 2048 plus one shared expert and the
    router), at 4.5 bits. The uniform spec above averages them: an expert layer is
    heavier than that average, a dense one far lighter.
    """
    hidden, vocab, bits = 7168, 129280, 4.5
    attention = 187_000_000
    dense = attention + 3 * hidden * 18432
    experts = attention + 257 * 3 * hidden * 2048 + 256 * hidden
    weights = tuple(int(p * bits / 8) for p in [dense] * 3 + [experts] * 58)
    embedding = int(vocab * hidden * bits / 8)
    return ModelSpec(
        n_layers=61,
        embedding_bytes=embedding,
        head_bytes=embedding + hidden * 2,
        kv_bytes_per_token_per_layer=(512 + 64) * 2,
        context_tokens=context_tokens,
        layer_weight_bytes=weights,
    )


def gemma3_27b_4bit(context_tokens: int = 131072) -> ModelSpec:
    """Gemma-3-27B-class at 4.5 bits: 62 layers, 5 sliding-window (1024 tokens) per global one.

    A sliding layer keeps at most its window in its cache, a global one the whole
    context: 8 kB per token per layer (16 KV heads of 128, bf16).
    """
    hidden, vocab, bits, kv_per_token, window = 5376, 262144, 4.5, 2 * 16 * 128 * 2, 1024
    per_layer = int((2 * hidden * 4096 + 2 * hidden * 2048 + 3 * hidden * 21504) * bits / 8)
    kv = tuple(kv_per_token * (context_tokens if i % 6 == 5 else min(window, context_tokens)) for i in range(62))
    embedding = int(vocab * hidden * bits / 8)
    return ModelSpec(
        n_layers=62,
        bytes_per_layer=per_layer,
        embedding_bytes=embedding,
        head_bytes=embedding + hidden * 2,
        kv_bytes_per_token_per_layer=kv_per_token,
        context_tokens=context_tokens,
        layer_kv_bytes=kv,
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
    Example(
        "DeepSeek-V3-class with each layer's own size, 8 x 64 GB at 56 GB",
        "DeepSeek-V3 4-bit, 3 dense + 58 expert layers",
        deepseek_v3_4bit_per_layer(),
        _studios(8, 56 * GB),
    ),
    Example(
        "Gemma-3-27B-class at 128k context on two 16 GB machines",
        "Gemma-3-27B 4-bit, sliding-window layers reserve only their window",
        gemma3_27b_4bit(),
        (NodeCapacity("mini-a", 16 * GB, 0.0004, 0.001), NodeCapacity("mini-b", 16 * GB, 0.0004, 0.001)),
    ),
)


THUNDERBOLT = Link(0.0002, 5e9)
ETHERNET_1G = Link(0.001, 1.25e8)
WIFI = Link(0.026, 5e7)  # 13 ms a hop, as mesh-llm measured over Wi-Fi


def _all_pairs(ids: list[str], link_of) -> dict[tuple[str, str], Link]:
    return {(a, b): link_of(a, b) for a in ids for b in ids if a != b}


def _macs_and_a_wifi_laptop() -> Example:
    macs = [NodeCapacity(f"mac-{i}", 450 * MB, 0.00012) for i in range(3)]
    laptop = NodeCapacity("laptop", 1 * GB, 0.00012)
    ids = [n.node_id for n in (*macs, laptop)]
    return Example(
        "SmolLM2-135M on three Macs on Thunderbolt and a laptop on Wi-Fi",
        SMOLLM2,
        replace(smollm2_135m(), activation_bytes=576 * 4),
        (*macs, laptop),
        _all_pairs(ids, lambda a, b: WIFI if "laptop" in (a, b) else THUNDERBOLT),
        "Thunderbolt between the Macs (0.2 ms round trip, 5 GB/s); Wi-Fi to the laptop (26 ms, 50 MB/s).",
    )


def _studios_on_two_hubs() -> Example:
    nodes = _studios(8, 56 * GB)
    hub = {n.node_id: int(n.node_id.split("-")[1]) % 2 for n in nodes}
    return Example(
        "DeepSeek-V3-class on 8 x 64 GB on two Thunderbolt hubs joined by 1 Gbit Ethernet",
        "DeepSeek-V3 4-bit",
        replace(deepseek_v3_4bit(), activation_bytes=7168 * 2),
        nodes,
        _all_pairs(list(hub), lambda a, b: THUNDERBOLT if hub[a] == hub[b] else ETHERNET_1G),
        "Even-numbered studios on one Thunderbolt hub, odd ones on the other (0.2 ms, 5 GB/s within a hub); "
        "1 Gbit Ethernet between the hubs (1 ms, 125 MB/s).",
    )


LINK_EXAMPLES: tuple[Example, ...] = (_macs_and_a_wifi_laptop(), _studios_on_two_hubs())
