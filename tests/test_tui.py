"""swarm-tui against real nodes: what is on screen matches /v1/topology, disconnects and
failover show, the chat pane streams the same answer as a non-streamed request, and the
real console script runs in a real terminal (tmux)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from helpers import chat_body, http_json
from node_process import running_node
from swarm.bench.cluster import free_port, get_json

from tui.app import SwarmTUI
from tui.client import NodeError
from tui.topology import Topology
from tui.widgets.bars import fetch_bar, layer_cells
from tui.widgets.chat_pane import ChatPane
from tui.widgets.event_log import EventLog

SIZE = (100, 30)
NODE_ARGS = ("--name", "tui-node-a")


async def wait_for(pilot, cond, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what or cond}:\n{pilot.app.screen_text()}")


async def test_nodes_and_layer_ranges_match_topology(node):
    app = SwarmTUI([node.url])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.topology is not None and app.topology.nodes, what="a topology")
        status, raw = get_json(node.url + "/v1/topology")
        assert status == 200
        topo = Topology.parse(raw)
        await pilot.pause(0.2)
        text = app.screen_text()
        assert topo.model_id in text and topo.swarm in text
        assert topo.open_swarm and "OPEN SWARM" in text  # this node has no secret: said in the header
        if topo.plan:
            assert topo.plan.id in text
        assert ("can serve" in text) == topo.can_serve
        pipe = topo.pipeline()
        assert pipe, raw
        lines = text.splitlines()
        for i, (n, (start, end)) in enumerate(pipe):
            assert n.name in text
            # The stage's row: its number, name and range on one line, its bar on the next.
            row = next(j for j, line in enumerate(lines) if n.name in line and f"[{start},{end})" in line)
            bar = lines[row + 1].split("│")[-2].rstrip().split()[-1]
            a, b = layer_cells(start, end, topo.n_layers, len(bar))
            assert bar[a:b] == "█" * (b - a) and set(bar[:a] + bar[b:]) <= {"·"}, (bar, start, end)
            assert n.address in lines[row + 1]
        for n, _reason in topo.others():
            assert n.name in text


async def test_chat_streams_the_same_answer_as_a_plain_request(node):
    prompt = "Tell me about swarms."
    status, want = http_json(node.url + "/v1/chat/completions", chat_body(prompt, 24))
    assert status == 200, want
    app = SwarmTUI([node.url], temperature=0, max_tokens=24)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.topology is not None, what="a topology")
        await pilot.press("c")
        await pilot.press(*prompt)
        await pilot.press("enter")
        pane = app.query_one(ChatPane)
        await wait_for(pilot, lambda: pane.prompt == prompt and not pane.busy, timeout=60, what="the answer")
        assert not pane.error
        assert pane.answer == want["choices"][0]["message"]["content"]
        assert pane.answer.strip()
        assert pane.path_text.startswith("via ")
        if isinstance(want.get("swarm"), dict):   # the nodes it passed through, by name
            for nid in want["swarm"].get("path", []):
                assert app.topology.name_of(nid) in pane.path_text
        await pilot.pause(0.2)
        assert pane.answer.strip().split()[0] in app.screen_text()


async def test_chat_with_the_defaults_answers_the_default_model_shortly(tmp_path, default_model):
    """No temperature from the dashboard: the node's greedy default gives a short right answer."""
    with running_node(tmp_path) as node:
        app = SwarmTUI([node.url])
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.topology is not None, what="a topology")
            await pilot.press("c")
            await pilot.press(*"What is the capital of France?")
            await pilot.press("enter")
            pane = app.query_one(ChatPane)
            await wait_for(pilot, lambda: pane.prompt and not pane.busy, timeout=120, what="the answer")
            assert not pane.error and "Paris" in pane.answer and len(pane.answer) < 200, pane.answer


async def test_killed_node_shows_disconnected(tmp_path, llama):
    with running_node(tmp_path, "--model", str(llama), "--name", "doomed") as n:
        app = SwarmTUI([n.url])
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: "doomed" in app.screen_text(), what="the node on screen")
            n.stop()
            await wait_for(pilot, lambda: "DISCONNECTED" in app.screen_text(), timeout=15, what="DISCONNECTED")
            text = app.screen_text()
            assert "unreachable" in text and "doomed" in text, text  # last snapshot kept, node marked
            assert any(f"lost {n.url}" in line for line in app.query_one(EventLog).lines_text)


async def test_switches_to_the_other_url_when_its_node_dies(tmp_path, tiny_models):
    with running_node(tmp_path, "--model", str(tiny_models["llama"]), "--name", "first") as a, \
            running_node(tmp_path, "--model", str(tiny_models["qwen2"]), "--name", "second") as b:
        app = SwarmTUI([a.url, b.url])
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: "first" in app.screen_text(), what="the first node")
            assert app.watcher.url == a.url
            a.stop()
            await wait_for(pilot, lambda: "second" in app.screen_text() and app.watcher.url == b.url,
                           timeout=15, what="the second node")
            log = app.query_one(EventLog).lines_text
            assert any(f"lost {a.url}" in line for line in log), log
            assert any(f"reconnected to {b.url}" in line for line in log), log
            text = app.screen_text()
            assert b.url in text and "DISCONNECTED" not in text


async def test_polls_when_the_event_stream_fails(node, monkeypatch):
    app = SwarmTUI([node.url])

    async def no_stream(url):
        raise NodeError("stream disabled by the test")
        yield  # an async generator, like the real one

    monkeypatch.setattr(app.client, "events", no_stream)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "[polling]" in app.screen_text(), what="polling mode")
        before = sum(n.stats.total_requests for n in app.topology.nodes.values())
        status, reply = await asyncio.to_thread(http_json, node.url + "/v1/chat/completions",
                                                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert status == 200, reply
        await wait_for(pilot, lambda: sum(n.stats.total_requests for n in app.topology.nodes.values()) > before,
                       timeout=5, what="a polled snapshot with the new request")
        await pilot.press("f")   # focus cycles; r refreshes without error
        first = app.focused
        await pilot.press("f")
        assert app.focused is not first
        await pilot.press("r")
        await pilot.pause(0.3)
        assert "[polling]" in app.screen_text()


async def test_swarm_events_read_as_sentences(tmp_path, tiny_models):
    """A second node joins the one the dashboard watches: its join, the new plan and the watched node's
    loading of it are sentences naming nodes and layers, not raw dicts or "new plan (none)"."""
    second_peer_port = free_port()  # each names the other as a static peer (no mDNS on loopback)
    with running_node(tmp_path, "--model", str(tiny_models["llama"]), "--name", "first", "--speed", "0.002",
                      "--peer", f"127.0.0.1:{second_peer_port}") as a:
        app = SwarmTUI([a.url])
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.topology is not None and "first" in app.screen_text(), what="first")
            with running_node(tmp_path, "--model", str(tiny_models["llama"]), "--name", "second", "--speed", "0.002",
                              "--peer-port", str(second_peer_port), "--peer", f"127.0.0.1:{a.peer_port}"):
                events = app.query_one(EventLog)  # its lines_text is replaced as lines come
                await wait_for(pilot, lambda: any("second" in line and "new plan" in line for line in events.lines_text)
                               and any("first has loaded" in line for line in events.lines_text), timeout=120,
                               what="the new plan, loaded")
                log = events.lines_text
                text = "\n".join(log)
                assert "second joined" in text, text
                [plan] = [line for line in log if "new plan" in line and "second" in line]
                assert "in 2 stages: first layers [0, 3) → second layers [3, 6)" in plan or \
                       "in 2 stages: second layers [0, 3) → first layers [3, 6)" in plan, plan
                plan_id = plan.split("new plan ")[1].split()[0]
                assert f"first has loaded its layers of plan {plan_id} and serves it" in text, text
                assert "{" not in text and "(none)" not in text, text


def test_a_plan_event_without_a_plan_says_why():
    log = EventLog()
    log.add("plan", "x")  # the widget is not mounted: lines_text still records
    log.add_event("plan", {"plan": None, "error": "the swarm cannot hold the model: 2 GiB short"}, str)
    log.add_event("weights_moved", {"node_id": "n1", "bytes": 5}, str)
    assert log.lines_text[-2].endswith("no plan: the swarm cannot hold the model: 2 GiB short")
    assert log.lines_text[-1].endswith("weights moved: node id n1, bytes 5")


def test_parsing_never_raises_on_partial_or_odd_json():
    for raw in [None, [], "x", {}, {"nodes": [{}], "plan": {"stages": [{"node_id": "a"}]}},
                {"nodes": [{"id": "a", "layers": [0, "x"], "stats": None, "addresses": None}], "links": [1]},
                {"model": {"n_layers": "30"}, "plan": {"stages": [{"node_id": "b", "start": 0, "end": 3}]}}]:
        t = Topology.parse(raw)
        t.pipeline(), t.others(), t.urls()
    t = Topology.parse({"plan": {"stages": [{"node_id": "b", "start": 0, "end": 3}]}, "nodes": []})
    assert [(n.id, span) for n, span in t.pipeline()] == [("b", (0, 3))]


def test_layer_bars_of_consecutive_stages_tile_the_width():
    for n_layers in (1, 6, 30, 80):
        for width in (5, 16, 37):
            cuts = sorted({0, n_layers} | {n_layers * k // 4 for k in range(1, 4)})
            spans = [layer_cells(a, b, n_layers, width) for a, b in zip(cuts, cuts[1:]) if b > a]
            assert all(b > a for a, b in spans)
            assert spans[0][0] == 0 and spans[-1][1] == width
            assert all(x[1] == y[0] for x, y in zip(spans, spans[1:])), (n_layers, width, spans)


def _tmux(sock: str, *args: str) -> str:
    # COLUMNS/LINES (set under pytest) would override the terminal's real size in the pane.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run(["tmux", "-L", sock, *args], check=True, capture_output=True, text=True, env=env).stdout


def _alive(sock: str) -> bool:
    return subprocess.run(["tmux", "-L", sock, "has-session", "-t", "t"], capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_runs_in_a_real_terminal_under_tmux(node):
    exe = shutil.which("swarm-tui")
    cmd = f"{exe} {node.url}" if exe else f"{sys.executable} -m tui.app {node.url}"
    sock = f"swarm-tui-test-{uuid.uuid4().hex[:8]}"    # a private tmux server, not the user's
    _tmux(sock, "new-session", "-d", "-s", "t", "-x", "100", "-y", "30", cmd + " --temperature 0 --max-tokens 8")

    def wait_screen(cond, timeout=60.0) -> str:   # a loaded 2-core machine takes long to start textual
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = _tmux(sock, "capture-pane", "-p", "-t", "t")
            if cond(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"screen never matched:\n{screen}")

    try:
        _, raw = get_json(node.url + "/v1/topology")
        topo = Topology.parse(raw)
        (first, (start, end)) = topo.pipeline()[0]
        # tmux may start the program at 80x24 and resize it right after: wait for the settled screen.
        # The hints show while the prompt is not focused (it takes q, r, c, f as text); one clean-clone CI run
        # started with the prompt focused, before the app named the node table as its first focus.
        screen = wait_screen(lambda s: first.name in s and f"[{start},{end})" in s and "[live]" in s
                             and "q quit" in s and topo.model_id in s)
        assert max(len(line) for line in screen.splitlines()) == 100
        _tmux(sock, "send-keys", "-t", "t", "c")
        # Type once the prompt has the focus (the hints go): keys sent before land on the node table.
        wait_screen(lambda s: "q quit" not in s)
        _tmux(sock, "send-keys", "-t", "t", "-l", "hello")
        _tmux(sock, "send-keys", "-t", "t", "Enter")
        screen = wait_screen(lambda s: "> hello" in s and "via " in s and "q quit" not in s)
        _tmux(sock, "send-keys", "-t", "t", "Escape")
        wait_screen(lambda s: "q quit" in s)   # out of the prompt, the hints are back
        time.sleep(0.5)   # a lone ESC followed at once by q would read as alt+q
        _tmux(sock, "send-keys", "-t", "t", "q")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(sock):
            time.sleep(0.2)
        assert not _alive(sock), "q did not quit the app:\n" + _tmux(sock, "capture-pane", "-p", "-t", "t")
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)


def test_a_node_getting_its_weights_shows_a_progress_bar():
    from rich.console import Console

    from tui.widgets.node_table import NodeTable

    fetch = {"state": "fetching", "done_bytes": 110 << 20, "total_bytes": 258 << 20, "received_bytes": 110 << 20,
             "needed_bytes": 258 << 20, "rate_bps": 31 << 20}
    raw = {"model": {"n_layers": 30}, "plan": {"stages": [{"node_id": "a", "start": 0, "end": 30}]},
           "nodes": [{"id": "a", "name": "holder", "state": "serving", "layers": [0, 30]},
                     {"id": "b", "name": "newcomer", "state": "fetching", "fetch": fetch},
                     {"id": "c", "name": "full-disk", "state": "no_disk", "fetch": {**fetch, "state": "no_disk"}}]}
    table = NodeTable()
    table.topology = Topology.parse(raw)
    console = Console(width=100, record=True)
    console.print(table._table())
    screen = console.export_text()
    newcomer = screen[screen.index("newcomer"):]
    assert "43% 110M/258M" in newcomer and "█" in newcomer.splitlines()[1], screen   # 80 columns: no rate
    assert "not enough disk" in screen[screen.index("full-disk"):], screen
    assert "%" not in screen[:screen.index("newcomer")], screen   # the holder shows its layers, not a fetch
    assert str(fetch_bar(110 << 20, 258 << 20, 31 << 20, "fetching", 40)).endswith(" 43% 110M/258M 31M/s")


def test_a_stage_shows_its_prompt_cache():
    from rich.console import Console

    from tui.widgets.node_table import NodeTable

    cache = {"max_bytes": 512 << 20, "entries": 2, "bytes": 38 << 20, "hits": 9, "misses": 1, "tokens_saved": 8123}
    raw = {"model": {"n_layers": 30}, "plan": {"stages": [{"node_id": "a", "start": 0, "end": 15},
                                                          {"node_id": "b", "start": 15, "end": 30}]},
           "nodes": [{"id": "a", "name": "warm", "state": "serving", "layers": [0, 15],
                      "stats": {"prompt_cache": cache}},
                     {"id": "b", "name": "cold", "state": "serving", "layers": [15, 30],
                      "stats": {"prompt_cache": {**cache, "entries": 0, "bytes": 0, "hits": 0}}}]}
    table = NodeTable()
    table.topology = Topology.parse(raw)
    console = Console(width=80, record=True)
    console.print(table._table())
    screen = console.export_text()
    third = screen.splitlines()[3].split()
    assert third == ["cache", "2×38M", "9", "hits", "8.1k", "saved"], screen
    assert "cache" not in screen[screen.index("cold"):], screen  # nothing kept, never hit: nothing shown


def test_an_entry_shows_its_drafts_and_tokens_per_pass():
    from rich.console import Console

    from tui.widgets.node_table import NodeTable

    drafts = {"mode": "lookup", "steps": 40, "drafts_proposed": 160, "drafts_accepted": 97, "tokens_per_pass": 3.425}
    raw = {"model": {"n_layers": 30}, "plan": {"stages": [{"node_id": "a", "start": 0, "end": 15},
                                                          {"node_id": "b", "start": 15, "end": 30}]},
           "nodes": [{"id": "a", "name": "entry", "state": "serving", "layers": [0, 15],
                      "stats": {"speculation": drafts}},
                     {"id": "b", "name": "quiet", "state": "serving", "layers": [15, 30],
                      "stats": {"speculation": {"mode": "lookup", "steps": 0, "drafts_proposed": 0,
                                                "drafts_accepted": 0, "tokens_per_pass": None}}}]}
    table = NodeTable()
    table.topology = Topology.parse(raw)
    console = Console(width=100, record=True)
    console.print(table._table())
    screen = console.export_text()
    assert screen.splitlines()[3].split() == ["3.4/pass", "drafts", "97/160"], screen
    assert "drafts" not in screen[screen.index("quiet"):], screen  # never drafted: nothing shown


def test_the_header_warns_of_an_open_swarm_only():
    from tui.widgets.header import SwarmHeader
    raw = {"swarm": "home", "model": {"id": "m"}, "can_serve": True, "nodes": []}
    for security, warned in (({"peers": "open"}, True), ({"peers": "secret", "secret_from": "--secret"}, False),
                             (None, False)):
        header = SwarmHeader()
        header.topology = Topology.parse({**raw, "security": security} if security else raw)
        assert ("OPEN SWARM" in header._text().plain) == warned, security


def test_the_memory_column_says_which_memory_a_node_offers():
    from rich.console import Console

    from tui.widgets.node_table import NodeTable

    G = 1 << 30
    raw = {"model": {"n_layers": 30}, "plan": {"stages": [{"node_id": "a", "start": 0, "end": 15},
                                                          {"node_id": "b", "start": 15, "end": 30}]},
           "nodes": [{"id": "a", "name": "gpu-box", "backend": "cuda", "memory_kind": "gpu", "memory_total": 24 * G,
                      "memory_available": 23 * G, "memory_used": 2 * G, "layers": [0, 15]},
                     {"id": "b", "name": "cpu-box", "backend": "cpu", "memory_total": 64 * G,
                      "memory_available": 50 * G, "memory_used": 2 * G, "layers": [15, 30]}]}
    table = NodeTable()
    table.topology = Topology.parse(raw)
    console = Console(width=120, record=True)
    console.print(table._table())
    screen = console.export_text()
    gpu_lines = screen[screen.index("gpu-box"):].splitlines()
    assert "cuda 2.0G/24G" in gpu_lines[0] and "█········ vram" in gpu_lines[1], screen
    cpu_lines = screen[screen.index("cpu-box"):].splitlines()
    assert "cpu 2.0G/64G" in cpu_lines[0] and "vram" not in cpu_lines[1], screen
