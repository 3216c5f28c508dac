"""Speeds that follow the present, on real nodes: a node whose CPU is capped is advertised slower and
loses layers, and gets them back once the cap is lifted.

Two real nodes on netns hosts measure their own speeds (none stated) and serve a steady stream of
chat requests. Node 1's process is put in a cgroup (v1 cpu controller) with a quota of 20% of one CPU:
within 60 s its advertised speed rises (node/present_speed.py: its real decode passes got slower and
stayed so) and the plan gives it fewer layers; the quota lifted, within 60 s its speed comes back
(its passes, or its idle probe if it has no layers left) and so do its layers.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path

import pytest
from helpers import chat_body
from netns import netns_unavailable_reason
from swarm_cluster import SwarmCluster

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
QUOTA = 0.2
REACT_S = 60.0
SETTLE_WATCH_S = 30.0


def cgroup_unavailable() -> str | None:
    if netns_unavailable_reason() is not None:
        return str(netns_unavailable_reason())
    if not (CPU_CGROUP / "cpu.cfs_quota_us").exists() or not os.access(CPU_CGROUP, os.W_OK):
        return "needs the cgroup v1 cpu controller, writable (root)"
    return None


pytestmark = pytest.mark.skipif(cgroup_unavailable() is not None, reason=str(cgroup_unavailable()))


class CpuCap:
    """A cgroup with a CPU quota; a process moved into it (every thread), and back out on `lift`."""

    def __init__(self, share: float) -> None:
        self.path = CPU_CGROUP / f"swarm-test-{secrets.token_hex(3)}"
        self.path.mkdir()
        period = int((self.path / "cpu.cfs_period_us").read_text())
        (self.path / "cpu.cfs_quota_us").write_text(str(int(period * share)))
        self.pids: list[int] = []

    def hold(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))
        self.pids.append(pid)

    def lift(self) -> None:
        for pid in self.pids:
            try:
                (CPU_CGROUP / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass  # it has exited
        self.pids = []
        if self.path.exists():
            self.path.rmdir()


def stage_of(cluster, node_id: str) -> tuple[float, int, str | None]:
    """(node's advertised speed, how many layers it serves, the plan id), as node 0 sees them."""
    top = cluster.nodes[0].topology() or {}
    for n in top.get("nodes", []):
        if n["id"] == node_id:
            layers = n.get("layers")
            return n["speed"], (layers[1] - layers[0]) if layers else 0, (top.get("plan") or {}).get("id")
    return 0.0, 0, None


def wait_for(what: str, check, timeout: float, cluster, t0: float, timeline: list):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            timeline.append(f"{what} after {time.monotonic() - t0:.0f} s")
            return last
        time.sleep(1.0)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last {last}); " + "; ".join(timeline)
                         + "\n" + cluster.log_tails(tail=40))


def test_a_capped_node_is_advertised_slower_loses_layers_and_gets_them_back(tmp_path, llama):
    cluster = SwarmCluster(tmp_path, 2, ["--model", str(llama)], stated_speed=False)
    stop = threading.Event()
    cap = None
    timeline: list[str] = []

    def load() -> None:  # a steady stream of requests: decode passes on every stage
        while not stop.is_set():
            try:
                cluster.nodes[0].post("/v1/chat/completions", chat_body("Tell me a story.", 24), timeout=60)
            except OSError:
                time.sleep(0.5)

    worker = threading.Thread(target=load, daemon=True)
    try:
        cluster.wait_serving(stages=2, timeout=180)
        slow_id = cluster.nodes[1].node_id
        worker.start()
        time.sleep(20)  # both serve a while: their speeds settle on what their passes take
        speed0, layers0, _ = stage_of(cluster, slow_id)
        assert layers0 > 0
        timeline.append(f"before: speed {speed0 * 1e3:.3f} ms, {layers0} layers")

        cap = CpuCap(QUOTA)
        cap.hold(cluster.nodes[1].proc.pid)
        t0 = time.monotonic()
        speed1, _, _ = wait_for("slower", lambda: (s := stage_of(cluster, slow_id))[0] > speed0 * 1.3 and s,
                                REACT_S, cluster, t0, timeline)
        _, layers1, _ = wait_for("fewer layers", lambda: (s := stage_of(cluster, slow_id))[1] < layers0 and s,
                                 REACT_S, cluster, t0, timeline)
        timeline.append(f"capped: speed {speed1 * 1e3:.3f} ms, {layers1} layers")

        cap.lift()
        t0 = time.monotonic()
        wait_for("faster again", lambda: (s := stage_of(cluster, slow_id))[0] < speed1 / 1.3 and s,
                 REACT_S, cluster, t0, timeline)
        wait_for("layers back", lambda: (s := stage_of(cluster, slow_id))[1] > layers1 and s,
                 REACT_S, cluster, t0, timeline)
        speed2, layers2, plan2 = stage_of(cluster, slow_id)
        timeline.append(f"after: speed {speed2 * 1e3:.3f} ms, {layers2} layers")
        # Under the same steady load, the plan then settles: no flapping between layouts.
        plans = {plan2}
        watch_until = time.monotonic() + SETTLE_WATCH_S
        while time.monotonic() < watch_until:
            plans.add(stage_of(cluster, slow_id)[2])
            time.sleep(1.0)
        plans.discard(None)
        timeline.append(f"plans in the {SETTLE_WATCH_S:.0f} s after: {len(plans)}")
        print("\n" + "; ".join(timeline))
        assert len(plans) <= 2, timeline
    finally:
        stop.set()
        if cap is not None:
            cap.lift()
        cluster.close()
        worker.join(timeout=70)
