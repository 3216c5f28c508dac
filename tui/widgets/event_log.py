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
        self._names: dict[str, str] = {}   # node id -> name, from join events

    def add(self, kind: str, message: str, when: float | None = None) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(when or time.time()))
        self.lines_text = self.lines_text[-499:] + [f"{stamp} {message}"]
        self.write(Text.assemble((stamp + " ", "dim"), (message, STYLE.get(kind, ""))))

    def add_event(self, kind: str, data: dict, name_of) -> None:
        """Render one topology event; `name_of(node_id)` gives a display name."""
        when = data.get("time") if isinstance(data.get("time"), (int, float)) else None
        if kind == "join" and data.get("name") and data.get("node_id"):
            self._names[str(data["node_id"])] = str(data["name"])
        name_of = self._knowing_joins(name_of)
        if kind in ("join", "leave"):
            who = data.get("name") or name_of(str(data.get("node_id", "?")))
            self.add(kind, f"{who} {'joined' if kind == 'join' else 'left'}", when)
        elif kind == "plan":
            self.add(kind, plan_sentence(data, name_of), when)
        elif kind == "plan_loaded":
            who = name_of(str(data.get("node_id", "?")))
            self.add("plan", f"{who} has loaded its layers of plan {data.get('plan_id') or '?'} and serves it", when)
        elif kind in ("request_started", "request_finished"):
            label = data.get("request")  # a number per entry node (request ids are not published)
            rid = f"#{label}" if isinstance(label, int) else str(data.get("request_id", "?"))[:8]
            at = f" at {name_of(str(data['entry']))}" if data.get("entry") else ""
            if kind == "request_started":
                self.add(kind, f"request {rid} started{at}", when)
            else:
                self.add(kind, f"request {rid} finished{at}, {data.get('tokens', '?')} tokens", when)
        else:  # a kind this dashboard does not know yet: its fields, readably
            fields = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in data.items() if k not in ("type", "time"))
            self.add("info", f"{kind.replace('_', ' ')}" + (f": {fields}" if fields else ""), when)

    def _knowing_joins(self, name_of):
        """`name_of`, but a node that joined goes by the name its join gave (a plan may name a node before
        the next snapshot does)."""
        return lambda node_id: self._names.get(node_id) or name_of(node_id)


def plan_sentence(data: dict, name_of) -> str:
    """A plan event as a sentence: the new plan's stages, or why there is none."""
    plan = data.get("plan") if isinstance(data.get("plan"), dict) else None
    if plan is None:
        error = data.get("error")
        return f"no plan: {error}" if error else "no plan: no node serves the model now"
    stages = plan.get("stages") if isinstance(plan.get("stages"), list) else []
    parts = [f"{name_of(str(s.get('node_id', '?')))} layers [{s.get('start')}, {s.get('end')})"
             for s in stages if isinstance(s, dict)]
    count = f"{len(parts)} stage{'s' if len(parts) != 1 else ''}"
    return f"new plan {plan.get('plan_id') or '?'} in {count}" + (": " + " → ".join(parts) if parts else "")
