"""Two header lines: what the swarm is and whether it can serve; what we are watching.

An open swarm (no swarm secret: anyone on the network can join, read and change every
prompt and answer) is said first, in red, where no truncation can hide it."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ..topology import Topology


class SwarmHeader(Static):
    DEFAULT_CSS = "SwarmHeader { height: 2; background: $boost; padding: 0 1; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.topology: Topology | None = None
        self.url, self.mode, self.note = "", "connecting", ""

    def set_topology(self, topo: Topology) -> None:
        self.topology = topo
        self.update(self._text())

    def set_connection(self, url: str, mode: str, note: str = "") -> None:
        self.url, self.mode, self.note = url, mode, note
        self.update(self._text())

    def _text(self) -> Text:
        t = self.topology
        top = Text()
        if t is None:
            top.append("swarm ", "dim").append("…")
        else:
            if t.open_swarm:
                top.append(" ⚠ OPEN SWARM ", "bold white on red").append(" ")
            top.append("swarm ", "dim").append(t.swarm, "bold")
            top.append("  model ", "dim").append(t.model_id, "bold")
            if t.n_layers:
                top.append(f" ({t.n_layers} layers)", "dim")
            if t.plan:
                top.append("  plan ", "dim").append(t.plan.id or "?", "bold")
                if t.plan.strategy:
                    top.append(f" {t.plan.strategy}", "dim")
            else:
                top.append("  no plan", "yellow")
        bottom = Text()
        if t is None:
            bottom.append("○ waiting for a topology", "yellow")
        elif self.mode == "disconnected":
            bottom.append("? can serve" if t.can_serve else f"? cannot serve: {t.status}", "dim")
            bottom.append(" (last known)", "dim")
        elif t.can_serve:
            bottom.append("● can serve", "bold green")
        else:
            bottom.append(f"✖ cannot serve: {t.status}", "bold red")
        style = {"live": "green", "polling": "yellow", "connected": "green"}.get(self.mode, "bold red")
        label = "DISCONNECTED" if self.mode == "disconnected" else self.mode
        bottom.append("   ").append(self.url or "?", "dim").append(f" [{label}]", style)
        if self.note:
            bottom.append(f" {self.note}", "dim")
        if t is not None and t.open_swarm:
            bottom.append("   no swarm secret: anyone on the network can join", "red")
        width = self.size.width - 2   # minus padding; 0 before the first layout
        if width > 0:
            for line in (top, bottom):
                line.truncate(width, overflow="ellipsis")
        return Text("\n").join([top, bottom])

    def on_resize(self) -> None:
        self.update(self._text())
