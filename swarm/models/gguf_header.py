"""Bounds-checked walk over a GGUF header before handing the file to mlx.

mlx's native GGUF reader trusts the counts and lengths in the header; a corrupt
file can make it crash the whole process (segfault) instead of raising. Walking
the header in Python first turns that into a ModelFormatError.
"""

import mmap
import struct
from pathlib import Path

from .errors import ModelFormatError, ModelNotFoundError

_MAGIC = b"GGUF"
_MAX_DIMS = 4  # GGML_MAX_DIMS
# GGUF metadata value types -> fixed byte size (None: variable length).
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, buf: mmap.mmap, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelFormatError(f"{self.path}: GGUF header is truncated or corrupt")
        chunk = self.buf[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def skip_string(self) -> None:
        self.take(self.u64())

    def skip_value(self, vtype: int, depth: int = 0) -> None:
        if vtype in _SCALAR_SIZE:
            self.take(_SCALAR_SIZE[vtype])
        elif vtype == _STRING:
            self.skip_string()
        elif vtype == _ARRAY and depth == 0:
            item_type, count = self.u32(), self.u64()
            if item_type in _SCALAR_SIZE:
                self.take(_SCALAR_SIZE[item_type] * count)
            else:
                for _ in range(count):
                    self.skip_value(item_type, depth + 1)
        else:
            raise ModelFormatError(f"{self.path}: unknown GGUF value type {vtype}")


def validate_gguf(path: Path) -> None:
    """Raise ModelNotFoundError / ModelFormatError unless the header is sound."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {path}")
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            _walk(_Reader(buf, path))
    except ValueError as e:  # mmap of an empty file
        raise ModelFormatError(f"{path}: not a GGUF file ({e})") from None


def _walk(r: _Reader) -> None:
    if r.take(4) != _MAGIC:
        raise ModelFormatError(f"{r.path}: not a GGUF file (bad magic)")
    version = r.u32()
    if version not in (2, 3):
        raise ModelFormatError(f"{r.path}: unsupported GGUF version {version}")
    n_tensors, n_kv = r.u64(), r.u64()
    for _ in range(n_kv):
        r.skip_string()
        r.skip_value(r.u32())
    for _ in range(n_tensors):
        r.skip_string()
        n_dims = r.u32()
        if not 1 <= n_dims <= _MAX_DIMS:
            raise ModelFormatError(f"{r.path}: tensor with {n_dims} dimensions")
        r.take(8 * n_dims + 4 + 8)  # dims, ggml type, data offset
