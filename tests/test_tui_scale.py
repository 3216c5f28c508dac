"""swarm-tui at 32 nodes: in 80x24 and 200x50 the header keeps the essentials, the nodes panel says how
many nodes there are, and scrolling it reaches every node, each on a whole row of its own.

The topology is served by a stand-in node (GET /v1/topology on loopback, the shape node_status.py
gives): a 32-layer model on 32 nodes, 28 of them stages and 4 idle, as a 32-node swarm shows it.
"""

from __future__ import annotations

import re
import time

import pytest
from aiohttp import web

from tui.app import SwarmTUI

NODES, STAGES, N_LAYERS = 32, 28, 32
GIB = 1 << 30


def node_id(i: int) -> str:
    return f"{i:04x}" + "9c3e5f1a7b2d"


def topology() -> dict:
    cuts = [i * N_LAYERS // STAGES for i in range(STAGES + 1)]
    stages = [{"node_id": node_id(i), "start": a, "end": b} for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]
    layers = {s["node_id"]: [s["start"], s["end"]] for s in stages}
    nodes = [{"id": node_id(i), "name": f"node{i}", "addresses": [f"10.77.1.{i + 1}"], "api_port": 8800,
              "peer_port": 8801, "backend": "cpu", "memory_total": 24 * GIB, "memory_available": 20 * GIB,
              "memory_kind": "ram", "memory_used": 3 << 20, "speed": 0.002, "measured_links": {},
              "state": "serving" if i < STAGES else "idle", "plan_id": "6c9ec3aaabf5",
              "layers": layers.get(node_id(i)), "self": i == 0, "model_id": "llama",
              "stats": {"active_requests": int(i == 0), "tokens_per_second": 9.5 if i == 0 else 0.0,
                        "total_requests": 3, "total_tokens": 180}, "fetch": None, "holds": None, "proven": True}
             for i in range(NODES)]
    idle = [{"node_id": node_id(i), "reason": "not needed: faster without it"} for i in range(STAGES, NODES)]
    return {"swarm": "default", "node_id": node_id(0), "updated_at": time.time(), "can_serve": True, "status": "ok",
            "security": {"peers": "open", "api_key": False},
            "model": {"id": "llama", "n_layers": N_LAYERS, "fingerprint": "f" * 32},
            "plan": {"id": "6c9ec3aaabf5", "model": "llama", "n_layers": N_LAYERS, "strategy": "balanced",
                     "stages": stages, "idle": idle, "bottleneck_s": 0.0045},
            "nodes": nodes, "links": [{"from": a["node_id"], "to": b["node_id"]} for a, b in zip(stages, stages[1:])],
            "proofs": None}


@pytest.fixture
async def stand_in():
    """A node that answers GET /v1/topology (and has no event stream: the dashboard polls)."""
    async def answer(_request):
        return web.json_response(topology())

    app = web.Application()
    app.router.add_get("/v1/topology", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_32_nodes_stay_readable(stand_in, size):
    app = SwarmTUI([stand_in])
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + 20
        while not (app.topology and len(app.topology.nodes) == NODES) and time.monotonic() < deadline:
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        text = app.screen_text()
        lines = text.splitlines()
        assert len(lines) == size[1] and max(len(line) for line in lines) <= size[0], text
        assert "llama" in text and "can serve" in text, text
        if size[0] >= 100:
            assert "6c9ec3aaabf5" in text, text
        # How many there are, where only a few rows fit: said in the panel's border.
        assert f"{NODES} nodes: {STAGES} stages, {NODES - STAGES} idle" in text, text
        # Scrolling the panel reaches every node: its name and layer range (or its idle reason) on one row.
        box = app.query_one("#nodes-box")
        seen, y = "", 0
        while True:
            box.scroll_to(y=y, animate=False)
            await pilot.pause(0.05)
            seen += app.screen_text() + "\n"
            if y >= box.max_scroll_y:
                break
            y = min(box.max_scroll_y, y + max(1, box.scrollable_content_region.height - 2))
        plan = app.topology.plan
        for i, stage in enumerate(plan.stages):
            row = re.compile(rf"\b{i + 1} +node{i} .*\[{stage.start},{stage.end}\)")
            assert any(row.search(line) for line in seen.splitlines()), (i, seen)
        for i in range(STAGES, NODES):
            assert any(re.search(rf"· +node{i} .*idle", line) for line in seen.splitlines()), (i, seen)
