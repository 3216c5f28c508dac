"""Memory the node advertises: total RAM and what is available for the model."""

from __future__ import annotations

import psutil


def measure_memory(memory_limit: int | None = None, device: tuple[int, int] | None = None) -> tuple[int, int]:
    """(total, available) bytes; `memory_limit` caps what is offered to the model.

    `device`: (total, available) of the memory the model lives in when it is not this host's RAM (a
    GPU's own, told by the engine); None: the RAM."""
    if device is None:
        vm = psutil.virtual_memory()
        total, available = int(vm.total), int(vm.available)
    else:
        total, available = int(device[0]), int(device[1])
    if memory_limit is not None:
        if memory_limit < 0:
            raise ValueError("memory_limit must be >= 0")
        available = min(available, int(memory_limit))
    return total, available


def parse_size(text: str) -> int:
    """'8G', '512M', '1.5GiB', '1000000' -> bytes (binary units)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = text.strip().upper().removesuffix("IB").removesuffix("B")
    suffix = s[-1:] if s[-1:] in units and s[-1:] else ""
    number = s[: len(s) - len(suffix)] if suffix else s
    try:
        value = float(number) * units[suffix]
    except ValueError:
        raise ValueError(f"not a size: {text!r}") from None
    if value < 0:
        raise ValueError(f"negative size: {text!r}")
    return int(value)
