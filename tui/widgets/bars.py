"""Text bars: a layer range over [0, n_layers) and a memory gauge, scaled to a width."""

from __future__ import annotations

from rich.text import Text

FULL, EMPTY = "█", "·"


def layer_cells(start: int, end: int, n_layers: int, width: int) -> tuple[int, int]:
    """Cells [a, b) of a `width`-cell bar covering layers [start, end) of n_layers.

    Boundaries are rounded the same way for every stage, so consecutive stages tile
    the bar without gaps or overlaps; a non-empty range always gets at least one cell.
    """
    if width <= 0 or n_layers <= 0:
        return 0, 0
    start, end = max(0, min(start, n_layers)), max(0, min(end, n_layers))
    a, b = round(start * width / n_layers), round(end * width / n_layers)
    if end > start and b <= a:
        a = min(a, width - 1)
        b = a + 1
    return a, b


def layer_bar(start: int, end: int, n_layers: int | None, width: int, style: str = "green") -> Text:
    if not n_layers:
        return Text("?" * max(width, 0), style="dim")
    a, b = layer_cells(start, end, n_layers, width)
    return Text.assemble((EMPTY * a, "dim"), (FULL * (b - a), style), (EMPTY * (width - b), "dim"))


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return f"{n}B"


def memory_bar(used: int | None, available: int | None, total: int | None, width: int) -> Text:
    """█ model weights this node holds, ▒ memory used by everything else, · free."""
    if not total or width <= 0:
        return Text(EMPTY * max(width, 0), style="dim")
    weights = min(max(used or 0, 0), total)
    busy = total - available if available is not None else weights
    w = min(width, round(weights * width / total))
    if weights > 0:
        w = max(w, 1)
    o = min(width - w, max(0, round(max(busy - weights, 0) * width / total)))
    return Text.assemble(("█" * w, "cyan"), ("▒" * o, "grey50"), (EMPTY * (width - w - o), "dim"))
