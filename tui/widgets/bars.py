"""Text bars: a layer range over [0, n_layers), a memory gauge and a fetch's progress, scaled to a width."""

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


def fetch_bar(done: int, total: int, rate_bps: float, state: str, width: int) -> Text:
    """`████····  42% 110M/258M 31M/s`: a node getting its weights from peers; the words say a stall."""
    words = {"looking": "looking for a peer that holds the model", "stuck": "stuck: no peer gives what is missing",
             "no_disk": "not enough disk for its layers", "mismatch": "no peer's manifest matches the model"}
    if state in words:
        return Text(words[state], "bold red" if state != "looking" else "yellow")
    pct = done / total if total > 0 else 0.0
    tails = [f" {pct * 100:3.0f}% {human_bytes(done)}/{human_bytes(total)} {human_bytes(int(rate_bps))}/s",
             f" {pct * 100:3.0f}% {human_bytes(done)}/{human_bytes(total)}", f" {pct * 100:3.0f}%"]
    tail = next((t for t in tails if width - len(t) >= 3), tails[-1])   # narrow: the rate goes first
    cells = max(0, width - len(tail))
    full = min(cells, int(pct * cells))
    return Text.assemble(("█" * full, "yellow"), (EMPTY * (cells - full), "dim"), (tail, ""))[:width]
