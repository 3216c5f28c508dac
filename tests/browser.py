"""A real headless Chromium (Debian's package) inside a test host, driven over the DevTools protocol.

    with Browser(host, tmp_path) as browser:
        browser.open("http://localhost:9000/page.html")
        browser.evaluate("(async () => (await fetch('/x')).status)()")

It runs inside the host's network namespace (so its traffic stays there, and the host's
/etc/netns/<ns>/hosts is its /etc/hosts); the DevTools socket listens on that host's loopback, and
this process talks to it from a thread in the same namespace (netns_client.in_netns).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from netns_client import in_netns

DEVTOOLS_PORT = 9222


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, host, profile_dir: Path):
        self.host, self.profile_dir = host, profile_dir
        self.proc = None
        self.ws_url: str | None = None
        self._ids = itertools.count(1)

    def __enter__(self) -> Browser:
        self.proc = self.host.spawn([chromium_path(), "--headless=new", "--no-sandbox", "--disable-gpu",
                                     "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
                                     "--disable-background-networking", "--disable-component-update",
                                     f"--remote-debugging-port={DEVTOOLS_PORT}", "--remote-debugging-address=127.0.0.1",
                                     f"--user-data-dir={self.profile_dir}", "about:blank"], label="chromium")
        deadline = time.monotonic() + 60
        while True:
            try:
                targets = in_netns(self.host.ns, _get_json, f"http://127.0.0.1:{DEVTOOLS_PORT}/json/list")
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    self.ws_url = pages[0]["webSocketDebuggerUrl"]
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.popen.poll() is not None:
                self.__exit__(None, None, None)
                raise RuntimeError(f"chromium did not start:\n{self.proc.logs(30)}")
            time.sleep(0.3)

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate(timeout=5)

    def open(self, url: str, timeout: float = 60) -> None:
        """Navigate the page to `url` and wait until it has loaded."""
        self.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.evaluate("[location.href, document.readyState]")
            if state[0] != "about:blank" and state[1] == "complete":
                return
            time.sleep(0.2)
        raise TimeoutError(f"{url} did not load")

    def evaluate(self, expression: str, timeout: float = 120) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True}, timeout)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def call(self, method: str, params: dict, timeout: float = 120) -> dict:
        return in_netns(self.host.ns, asyncio.run, self._call(method, params, timeout))

    async def _call(self, method: str, params: dict, timeout: float) -> dict:
        call_id = next(self._ids)
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(self.ws_url, max_msg_size=0) as ws:
                await ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
                async with asyncio.timeout(timeout):
                    async for msg in ws:
                        data = json.loads(msg.data)
                        if data.get("id") == call_id:
                            if "error" in data:
                                raise RuntimeError(f"{method}: {data['error']}")
                            return data["result"]
        raise RuntimeError(f"{method}: the DevTools socket closed")


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())
