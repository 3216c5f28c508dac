"""mx.array <-> (dtype, shape, raw bytes) for activations and token ids.

A message carrying an array (messages.Forward) puts "dtype" and "shape" in its
header and the raw C-order bytes in its payload. Encoding exposes the array's own
buffer (no copy); decoding makes exactly one copy, into MLX memory.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import numpy as np

from .errors import ProtocolError

# wire name -> (mlx dtype, numpy dtype used to carry the bytes)
_DTYPES: dict[str, tuple[mx.Dtype, type]] = {
    "float32": (mx.float32, np.float32),
    "float16": (mx.float16, np.float16),
    "bfloat16": (mx.bfloat16, np.uint16),  # numpy has no bfloat16: same bits as uint16
    "int32": (mx.int32, np.int32),
}
_WIRE_NAME = {mlx_dtype: name for name, (mlx_dtype, _) in _DTYPES.items()}
WIRE_DTYPES: dict[str, int] = {name: np.dtype(carrier).itemsize for name, (_, carrier) in _DTYPES.items()}  # bytes each
MAX_DIMS = 8


def encode_array(a: mx.array) -> tuple[str, list[int], memoryview]:
    """(dtype name, shape, a view of the array's bytes); ValueError for unsupported dtypes."""
    name = _WIRE_NAME.get(a.dtype)
    if name is None:
        raise ValueError(f"cannot send arrays of dtype {a.dtype}; supported: {sorted(_DTYPES)}")
    view = memoryview(a)  # evaluates the array
    if not view.c_contiguous:  # a transposed/sliced view: materialise C order once
        a = mx.contiguous(a)
        view = memoryview(a)
    return name, list(a.shape), view.cast("B")


def decode_array(dtype: Any, shape: Any, data: bytes | memoryview) -> mx.array:
    """The array encoded by `encode_array`; ProtocolError if the three do not fit together."""
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise ProtocolError(f"array dtype {dtype!r} not one of {sorted(_DTYPES)}")
    if (
        not isinstance(shape, (list, tuple))
        or len(shape) > MAX_DIMS
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise ProtocolError(f"array shape {shape!r} is not a list of at most {MAX_DIMS} sizes")
    mlx_dtype, carrier = _DTYPES[dtype]
    expected = math.prod(shape) * np.dtype(carrier).itemsize
    if memoryview(data).nbytes != expected:
        raise ProtocolError(f"{dtype}{list(shape)} needs {expected} bytes, got {memoryview(data).nbytes}")
    values = mx.array(np.frombuffer(data, dtype=carrier).reshape(shape))
    return values.view(mlx_dtype) if dtype == "bfloat16" else values
