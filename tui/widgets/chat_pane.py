"""Chat pane: a prompt input and the streamed answer, with the nodes it passed through."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Static


class ChatPane(Vertical):
    DEFAULT_CSS = """
    ChatPane { border: round $primary-darken-2; }
    ChatPane #chat-scroll { height: 1fr; }
    ChatPane #chat-path { height: 1; color: $text-muted; }
    ChatPane Input { height: 3; }
    """

    class Ask(Message):
        def __init__(self, prompt: str):
            super().__init__()
            self.prompt = prompt

    def __init__(self, **kw):
        super().__init__(**kw)
        self.border_title = "chat"
        self.prompt, self.answer, self.error = "", "", ""
        self.path_text = ""
        self.busy = False

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="chat-scroll"):
            yield Static(Text("type a prompt below and press enter", "dim"), id="chat-answer")
        yield Static("", id="chat-path")
        yield Input(placeholder="prompt (c to focus, enter to send)", id="chat-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        prompt = event.value.strip()
        if prompt and not self.busy:
            event.input.value = ""
            self.post_message(self.Ask(prompt))

    def start(self, prompt: str) -> None:
        self.prompt, self.answer, self.error, self.busy = prompt, "", "", True
        self.set_path("waiting for the first token…")
        self._redraw()

    def append(self, text: str) -> None:
        self.answer += text
        self._redraw()

    def finish(self, path: str, error: str = "") -> None:
        self.busy, self.error = False, error
        self.set_path(path)
        self._redraw()

    def set_path(self, text: str) -> None:
        self.path_text = text
        self.query_one("#chat-path", Static).update(Text(text, no_wrap=True, overflow="ellipsis"))

    def _redraw(self) -> None:
        out = Text.assemble(("> ", "bold cyan"), (self.prompt + "\n", "bold"), (self.answer, ""))
        if self.busy:
            out.append("▌", "blink")
        if self.error:
            out.append(f"\n{self.error}", "bold red")
        self.query_one("#chat-answer", Static).update(out)
        self.query_one("#chat-scroll", VerticalScroll).scroll_end(animate=False)
