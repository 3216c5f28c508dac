"""Where each tensor of a safetensors file lies, read from the file's header alone.

    file: u64 little-endian N | N bytes of JSON header | tensor data
    header: {"name": {"dtype": ..., "shape": [...], "data_offsets": [start, end]}, "__metadata__": {...}}

Offsets in the header count from the end of the header; TensorSpan gives them
from the start of the file, so a holder can serve any tensor as a byte range
without loading anything.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit
_LENGTH = struct.Struct("<Q")


class SafetensorsError(ValueError):
    """Not a readable safetensors file."""


@dataclass(frozen=True)
class TensorSpan:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # byte offsets in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SafetensorsLayout:
    header_bytes: int  # the 8-byte length and the JSON header: where tensor data begins
    file_bytes: int
    tensors: tuple[TensorSpan, ...]  # in file order


def read_layout(path: Path) -> SafetensorsLayout:
    with open(path, "rb") as f:
        raw_len = f.read(_LENGTH.size)
        if len(raw_len) != _LENGTH.size:
            raise SafetensorsError(f"{path}: too short for a safetensors file")
        (n,) = _LENGTH.unpack(raw_len)
        if n > MAX_HEADER_BYTES:
            raise SafetensorsError(f"{path}: header of {n} bytes")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise SafetensorsError(f"{path}: header is not JSON: {e}") from None
        file_bytes = f.seek(0, 2)
    base = _LENGTH.size + n
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = entry["data_offsets"]
            span = TensorSpan(name, str(entry["dtype"]), tuple(int(d) for d in entry["shape"]), base + start, base + end)
        except (KeyError, TypeError, ValueError) as e:
            raise SafetensorsError(f"{path}: bad entry for {name!r}: {e}") from None
        if not base <= span.start <= span.end <= file_bytes:
            raise SafetensorsError(f"{path}: {name!r} lies outside the file")
        tensors.append(span)
    tensors.sort(key=lambda t: t.start)
    return SafetensorsLayout(base, file_bytes, tuple(tensors))
