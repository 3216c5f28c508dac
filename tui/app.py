"""swarm-tui: a live topology dashboard for a swarm, over a node's HTTP API only.

    swarm-tui [URL ...]      (default http://127.0.0.1:8800)

It watches one node (the first URL that answers) through GET /v1/topology/events,
falls back to polling GET /v1/topology, and fails over to any other known node.
"""

from __future__ import annotations

import argparse
import io
import os
import time

from rich.console import Console

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer, Input

from .client import NodeClient, NodeError
from .topology import Topology
from .watcher import Watcher
from .widgets.chat_pane import ChatPane
from .widgets.event_log import EventLog
from .widgets.header import SwarmHeader
from .widgets.node_table import NodeTable

DEFAULT_URL = "http://127.0.0.1:8800"


class SwarmTUI(App):
    TITLE = "swarm"
    CSS = """
    #nodes-box { height: auto; max-height: 50%; border: round $primary; }
    #bottom { height: 1fr; }
    #log { width: 1fr; }
    #chat { width: 1fr; }
    """
    # The node table first, never the prompt: a focused prompt takes q, r, c and f as text (and the footer
    # hides them), which textual's default (the first focusable widget) once did on a loaded machine.
    AUTO_FOCUS = "#nodes-box"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("r", "refresh", "refresh"),
        Binding("c", "chat", "chat"),
        Binding("f", "app.focus_next", "focus", key_display="tab/f"),
        Binding("escape", "leave_input", "leave prompt", show=False),
    ]

    def __init__(self, urls: list[str] | None = None, temperature: float | None = None,
                 max_tokens: int | None = 256, api_key: str | None = None):
        super().__init__()
        self.urls = [u.rstrip("/") for u in (urls or [DEFAULT_URL])]
        self.temperature, self.max_tokens = temperature, max_tokens
        self.client = NodeClient(api_key=api_key)
        self.topology: Topology | None = None
        self.connected = False
        self._last_status: str | None = None
        self.watcher = Watcher(self.client, self.urls, self._on_snapshot, self._on_event, self._on_status)

    def compose(self) -> ComposeResult:
        yield SwarmHeader(id="header")
        with VerticalScroll(id="nodes-box") as box:
            box.border_title = "nodes (pipeline order)"
            yield NodeTable(id="nodes")
        with Horizontal(id="bottom"):
            yield EventLog(id="log")
            yield ChatPane(id="chat")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(SwarmHeader).set_connection(self.urls[0], "connecting")
        self.watch_swarm()

    @work(exclusive=True, group="watch")
    async def watch_swarm(self) -> None:
        await self.watcher.run()

    async def on_unmount(self) -> None:
        await self.client.close()

    def screen_text(self) -> str:
        """The screen as plain text, as a terminal would show it (tests, screenshots)."""
        console = Console(width=self.size.width, height=self.size.height, file=io.StringIO(),
                          force_terminal=True, record=True, legacy_windows=False)
        console.print(self.screen._compositor.render_update(full=True))
        return console.export_text()

    # -- watcher callbacks (run on the app's event loop) --

    def _on_snapshot(self, raw: dict) -> None:
        self.topology = Topology.parse(raw)
        self.query_one(SwarmHeader).set_topology(self.topology)
        self.query_one(NodeTable).set_topology(self.topology)
        # How many there are, where only a few rows fit (a 32-node swarm at 80x24: the rest by scrolling).
        stages, idle = len(self.topology.pipeline()), len(self.topology.others())
        self.query_one("#nodes-box").border_title = \
            f"{stages + idle} nodes: {stages} stages, {idle} idle (pipeline order)"

    def _on_event(self, kind: str, data: dict) -> None:
        name_of = self.topology.name_of if self.topology else (lambda i: i[:8])
        self.query_one(EventLog).add_event(kind, data, name_of)

    def _on_status(self, connected: bool, url: str, mode: str, message: str | None) -> None:
        self.connected = connected
        self.query_one(SwarmHeader).set_connection(url, mode)
        if not connected and self.topology is not None:
            # Keep the last snapshot on screen, marking the node we lost.
            self.query_one(NodeTable).set_topology(self.topology, unreachable=self.topology.node_id)
        if message and message != self._last_status:   # retries repeat themselves every second
            self.query_one(EventLog).add("connect" if connected else "disconnect", message)
        self._last_status = message

    # -- actions --

    async def action_refresh(self) -> None:
        await self.watcher.refresh()

    def action_chat(self) -> None:
        self.query_one("#chat-input", Input).focus()

    def action_leave_input(self) -> None:
        if isinstance(self.focused, Input):
            self.query_one("#nodes-box").focus()

    def on_chat_pane_ask(self, message: ChatPane.Ask) -> None:
        self.ask(message.prompt)

    @work(exclusive=True, group="chat")
    async def ask(self, prompt: str) -> None:
        pane = self.query_one(ChatPane)
        pane.start(prompt)
        url, swarm, error, started, n = self.watcher.url, {}, "", time.monotonic(), 0
        try:
            async for chunk in self.client.chat(url, [{"role": "user", "content": prompt}],
                                                temperature=self.temperature, max_tokens=self.max_tokens):
                if chunk.text:
                    n += 1
                    pane.append(chunk.text)
                if chunk.swarm:
                    swarm = chunk.swarm
        except NodeError as e:
            error = f"error from {url}: {e}"
        path = "" if error and not swarm else self._path_text(swarm, url, n, time.monotonic() - started)
        pane.finish(path, error)

    def _path_text(self, swarm: dict, url: str, n: int, seconds: float) -> str:
        name_of = self.topology.name_of if self.topology else (lambda i: i[:8])
        path = swarm.get("path") if isinstance(swarm.get("path"), list) else []
        via = "via " + (" → ".join(name_of(str(p)) for p in path) if path else "? (path not reported)")
        if swarm.get("entry") and (not path or swarm["entry"] != path[0]):
            via += f" (entry {name_of(str(swarm['entry']))})"
        return f"{via} · {n} chunks in {seconds:.1f}s"

def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="swarm-tui", description="Live topology dashboard for a swarm.")
    p.add_argument("urls", nargs="*", default=[DEFAULT_URL],
                   help=f"node API URLs to watch, first that answers wins (default: {DEFAULT_URL})")
    p.add_argument("--temperature", type=float, default=None, help="chat sampling temperature (default: the node's)")
    p.add_argument("--max-tokens", type=int, default=256, help="chat answer length cap (default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("SWARM_API_KEY"),
                   help="the nodes' API key, if they require one (default: $SWARM_API_KEY)")
    args = p.parse_args(argv)
    SwarmTUI(args.urls, args.temperature, args.max_tokens, args.api_key).run()


if __name__ == "__main__":
    main()
