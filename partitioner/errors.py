"""Errors raised by the partitioner."""

from __future__ import annotations


class InsufficientMemoryError(ValueError):
    """The swarm cannot hold the model under any split.

    Carries the numbers so a caller (or a TUI) can say how far off it is.
    """

    def __init__(self, needed_bytes: int, available_bytes: int, detail: str = ""):
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        message = (
            f"model needs {needed_bytes:,} bytes but the swarm has "
            f"{available_bytes:,} bytes available"
        )
        if detail:
            message += f" ({detail})"
        super().__init__(message)
