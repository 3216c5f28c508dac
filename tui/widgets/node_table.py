"""The nodes panel: pipeline stages in order (with arrows between them), then idle nodes.

Each node takes two lines so everything fits in 80 columns:
    1  mac-studio        cpu  0.5G/24G  4.2ms/L   7.1 t/s  [0, 11)  11 layers
    ↓  10.0.0.2:8800     █▒▒·······     serving   1 req    ████████···········
       cache 1×38M       9 hits         1.2k saved
A third line tells the stage's prompt cache once it keeps something or was hit: entries × bytes,
hits, and the positions they did not compute (engine/prompt_cache.py).
The layer bar spans the remaining width and is drawn over [0, n_layers); a node getting its
weights from peers shows the fetch's progress there instead (bytes done of its stage, rate).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ..topology import NodeInfo, Topology
from .bars import fetch_bar, human_bytes, layer_bar, memory_bar

STATE_STYLE = {"serving": "green", "loading": "yellow", "joining": "yellow", "idle": "blue",
               "gone": "red", "unreachable": "bold red", "fetching": "yellow", "looking": "yellow",
               "stuck": "bold red", "no_disk": "bold red", "mismatch": "bold red"}
# Which memory a node offers when it is not the host's RAM: a GPU's own, Metal's recommended working set.
MEMORY_WORDS = {"gpu": " vram", "working_set": " wset"}
FIXED = {"#": 2, "node": 16, "memory": 14, "speed": 11, "live": 8}
PADDING = 2 * len(FIXED)   # one space each side of every column but the table's edges


def _speed(node: NodeInfo) -> str:
    if node.speed is None:
        return "?"
    return f"{node.speed * 1000:.1f}ms/L" if node.speed < 1 else f"{node.speed:.1f}s/L"


def _prompt_cache(node: NodeInfo) -> list[str]:
    """The third line's words for the node, memory and speed columns (none: nothing kept, never hit)."""
    s = node.stats
    if not (s.cache_entries or s.cache_hits):
        return []
    saved = s.cache_tokens_saved
    saved_text = f"{saved / 1000:.1f}k" if saved >= 1000 else str(saved)
    return [f"cache {s.cache_entries}×{human_bytes(s.cache_bytes)}", f"{s.cache_hits} hits", f"{saved_text} saved"]


def _speculation(node: NodeInfo) -> tuple[str, str] | None:
    """The third line's words for the live and layers columns: tokens per pass of the steps that carried
    drafts, and the drafts accepted of those proposed, "drafts 97/160" (none: this entry never drafted)."""
    s = node.stats
    if not s.drafts_proposed:
        return None
    return f"{s.tokens_per_pass:.1f}/pass", f"drafts {s.drafts_accepted}/{s.drafts_proposed}"


def _two(first, second) -> Text:
    a = first if isinstance(first, Text) else Text(str(first))
    b = second if isinstance(second, Text) else Text(str(second))
    return Text("\n").join([a, b])


class NodeTable(Static):
    DEFAULT_CSS = "NodeTable { height: auto; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.topology: Topology | None = None
        self.unreachable: str | None = None   # node id we watched and lost

    def set_topology(self, topo: Topology | None, unreachable: str | None = None) -> None:
        self.topology, self.unreachable = topo, unreachable
        self.update(self._table())

    def on_resize(self) -> None:
        self.update(self._table())

    def _state(self, node: NodeInfo) -> Text:
        state = "unreachable" if node.id == self.unreachable else node.state
        return Text(state, STATE_STYLE.get(state, ""))

    def _cells(self, node: NodeInfo, link: Text, layers: Text) -> list[Text]:
        name = Text(node.name, "bold" if node.is_self else "")
        if node.is_self:
            name.append(" *", "cyan")
        mem = Text(f"{node.backend} {human_bytes(node.memory_used)}/{human_bytes(node.memory_total)}")
        kind = MEMORY_WORDS.get(node.memory_kind, "")  # beside the bar: the first line is full
        bar = memory_bar(node.memory_used, node.memory_available, node.memory_total, FIXED["memory"] - len(kind))
        bar.append(kind, "dim")
        tps = node.stats.tokens_per_second
        live = Text(f"{tps:.1f} t/s" if tps < 100 else f"{tps:.0f} t/s", "bold" if tps else "dim")
        reqs = Text(f"{node.stats.active_requests} req", "bold magenta" if node.stats.active_requests else "dim")
        return [link, _two(name, Text(node.address, "dim")),
                _two(mem, bar),
                _two(_speed(node), self._state(node)), _two(live, reqs), layers]

    @staticmethod
    def _with_third_line(node: NodeInfo, cells: list[Text]) -> list[Text]:
        """A third line for a stage's prompt cache and its entry's drafts, when there is any."""
        cache, drafts = _prompt_cache(node), _speculation(node)
        if not cache and not drafts:
            return cells
        third = [Text("")] + [Text(w, "cyan") for w in cache or ("", "", "")]
        third += [Text(w, "green") for w in drafts or ("", "")]
        return [_two(cell, extra) for cell, extra in zip(cells, third)]

    @staticmethod
    def _fetch(node: NodeInfo, width: int) -> Text | None:
        f = node.fetch
        return fetch_bar(f.done_bytes, f.total_bytes, f.rate_bps, f.state, width) if f.active else None

    def _table(self) -> Table | Text:
        t = self.topology
        if t is None:
            return Text("no topology yet", "dim")
        bar_w = max(8, (self.size.width or 80) - sum(FIXED.values()) - PADDING - 1)
        table = Table(box=None, padding=(0, 1), pad_edge=False, expand=False, show_edge=False,
                      header_style="bold dim")
        for col, w in FIXED.items():
            table.add_column(col if col != "#" else "", width=w, no_wrap=True, overflow="ellipsis")
        table.add_column("layers", width=bar_w, no_wrap=True, overflow="ellipsis")
        pipe = t.pipeline()
        # Arrows follow the API's links when it gives them, else stage order.
        nxt = dict(t.links) if t.links else {a.id: b.id for (a, _), (b, _) in zip(pipe, pipe[1:])}
        for i, (node, span) in enumerate(pipe):
            down = "↓" if node.id in nxt else ("↺" if len(pipe) > 1 else " ")
            link = _two(Text(str(i + 1), "bold"), Text(down, "bold cyan"))
            start, end = span if span else (0, 0)
            count = f" {end - start} layers" if bar_w >= 20 else f" {end - start}L"
            head = Text(f"[{start},{end})", "bold").append(count, "dim")
            # A stage still getting (new) layers from peers shows that instead of where they sit.
            bar = self._fetch(node, bar_w) or layer_bar(start, end, t.n_layers, bar_w)
            table.add_row(*self._with_third_line(node, self._cells(node, link, _two(head, bar))))
        for node, reason in t.others():
            link = _two(Text("·", "dim"), Text(" "))
            why = _two(Text("idle", "blue"), self._fetch(node, bar_w) or Text(reason or "", "dim italic"))
            table.add_row(*self._cells(node, link, why))
        if not pipe and not t.others():
            return Text("no nodes reported", "dim")
        return table
