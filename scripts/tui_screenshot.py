"""Save an SVG screenshot of swarm-tui watching a running node (headless, no terminal needed).

    python scripts/tui_screenshot.py [URL ...] [--out docs/tui.svg] [--size 100x30] [--prompt TEXT]

Waits until the topology is on screen, optionally asks the chat pane one question
(temperature 0) so the answer and its path show, then writes the SVG and prints the
screen as text.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tui.app import DEFAULT_URL, SwarmTUI  # noqa: E402
from tui.widgets.chat_pane import ChatPane  # noqa: E402


async def shoot(urls: list[str], out: Path, size: tuple[int, int], prompt: str | None, settle: float) -> str:
    app = SwarmTUI(urls, temperature=0, max_tokens=32)
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + 30
        while not (app.topology and app.topology.nodes) and time.monotonic() < deadline:
            await pilot.pause(0.1)
        if not app.topology:
            raise SystemExit(f"no topology from {urls} within 30s:\n{app.screen_text()}")
        if prompt:
            await pilot.press("c", *prompt, "enter")
            pane = app.query_one(ChatPane)
            while (pane.busy or pane.prompt != prompt) and time.monotonic() < deadline + 60:
                await pilot.pause(0.1)
            await pilot.press("escape")
        await pilot.pause(settle)   # let a snapshot or two arrive so live stats show
        out.parent.mkdir(parents=True, exist_ok=True)
        app.save_screenshot(filename=out.name, path=str(out.parent))
        return app.screen_text()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("urls", nargs="*", default=[DEFAULT_URL])
    p.add_argument("--out", type=Path, default=Path("docs/tui.svg"))
    p.add_argument("--size", default="100x30", help="COLSxROWS (default: %(default)s)")
    p.add_argument("--prompt", default="What is a swarm?", help="chat prompt to show ('' for none)")
    p.add_argument("--settle", type=float, default=1.5, help="seconds to wait before the shot")
    args = p.parse_args()
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    print(asyncio.run(shoot(args.urls, args.out, (cols, rows), args.prompt or None, args.settle)))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
