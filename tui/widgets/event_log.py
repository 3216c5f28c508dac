"""Timestamped log of swarm events (joins, leaves, plan changes, requests, connection)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import RichLog

STYLE = {"join": "green", "leave": "red", "plan": "cyan", "request_started": "magenta",
         "request_finished": "magenta", "connect": "green", "disconnect": "bold red", "info": "dim"}


class EventLog(RichLog):
    DEFAULT_CSS = "EventLog { border: round $primary-darken-2; }"

    def __init__(self, **kw):
        super().__init__(wrap=True, markup=False, max_lines=500, min_width=20, **kw)
        self.border_title = "events"
        self.lines_text: list[str] = []   # plain copy, for tests and the screenshot script

    def add(self, kind: str, message: str, when: float | None = None) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(when or time.time()))
        self.lines_text = self.lines_text[-499:] + [f"{stamp} {message}"]
        self.write(Text.assemble((stamp + " ", "dim"), (message, STYLE.get(kind, ""))))

    def add_event(self, kind: str, data: dict, name_of) -> None:
        """Render one topology event; `name_of(node_id)` gives a display name."""
        when = data.get("time") if isinstance(data.get("time"), (int, float)) else None
        if kind in ("join", "leave"):
            who = data.get("name") or name_of(str(data.get("node_id", "?")))
            self.add(kind, f"{who} {'joined' if kind == 'join' else 'left'}", when)
        elif kind == "plan":
            plan = data.get("plan") if isinstance(data.get("plan"), dict) else {}
            stages = plan.get("stages") if isinstance(plan.get("stages"), list) else []
            parts = [f"{name_of(str(s.get('node_id', '?')))}[{s.get('start')},{s.get('end')})"
                     for s in stages if isinstance(s, dict)]
            self.add(kind, f"new plan {plan.get('id') or '(none)'}" + (": " + " → ".join(parts) if parts else ""),
                     when)
        elif kind in ("request_started", "request_finished"):
            label = data.get("request")  # a number per entry node (request ids are not published)
            rid = f"#{label}" if isinstance(label, int) else str(data.get("request_id", "?"))[:8]
            at = f" at {name_of(str(data['entry']))}" if data.get("entry") else ""
            if kind == "request_started":
                self.add(kind, f"request {rid} started{at}", when)
            else:
                self.add(kind, f"request {rid} finished{at}, {data.get('tokens', '?')} tokens", when)
        else:
            self.add("info", f"{kind}: {data}")
