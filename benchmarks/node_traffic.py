"""What an idle swarm's nodes cost each other as the swarm grows: packets and CPU per node, whole nodes.

    sudo .venv/bin/python benchmarks/node_traffic.py [--sizes 4,8,16,32] [--settle 40] [--window 30]

For each size N: N netns hosts (tests/netns.py: nothing touches eth0), each running a whole `swarm-node`
of the tiny random llama (6 layers, equal stated speeds: 6 stages at most, the rest idle entries). Once
every node has one plan, and `--settle` seconds more (the first link measurements), the kernel's counters
of each host's namespace and each process's CPU seconds are read over `--window` seconds with no
request: mDNS datagrams, TCP segments (liveness probes, link-meter pings, profile fetches), and CPU,
which counts the planning every peer event brings. Per node per second, and TCP segments per peer.
benchmarks/discovery_traffic.py measures discovery alone.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from model_zoo import build_random_model  # noqa: E402
from netns import netns_unavailable_reason  # noqa: E402
from swarm_cluster import SwarmCluster  # noqa: E402
from traffic import quiet_window  # noqa: E402


def one_plan(cluster: SwarmCluster) -> str | None:
    ids = set()
    for node in cluster.nodes:
        top = node.topology()
        if not (top and top["plan"] and top["can_serve"]):
            return None
        ids.add(top["plan"]["id"])
    return ids.pop() if len(ids) == 1 else None


def measure(size: int, model: Path, root: Path, settle: float, window: float) -> dict[str, float]:
    cluster = SwarmCluster(root / f"n{size}", size, ["--model", str(model)], start=False)
    try:
        for node in cluster.nodes:
            node.start()
        started = time.monotonic()
        cluster.wait_for("one plan", lambda: one_plan(cluster), timeout=120 + 5 * size, every=1.0)
        agreed = time.monotonic() - started
        time.sleep(settle)
        per = quiet_window([n.host for n in cluster.nodes], [n.proc.pid for n in cluster.nodes], window)
        per["agreed"] = agreed
        return per
    finally:
        cluster.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4,8,16,32")
    p.add_argument("--settle", type=float, default=40.0)
    p.add_argument("--window", type=float, default=30.0)
    args = p.parse_args()
    if netns_unavailable_reason():
        sys.exit(f"cannot run: {netns_unavailable_reason()}")
    root = Path(tempfile.mkdtemp(prefix="node-traffic-"))
    model = build_random_model(root / "llama", "llama", n_layers=6, seed=1)
    print(f"{'nodes':>5} {'plan s':>6} {'mDNS out/s':>10} {'mDNS in/s':>10} {'TCP out/s':>10} {'TCP in/s':>9} "
          f"{'CPU %':>6}   per node; TCP out/s per peer", flush=True)
    for size in (int(s) for s in args.sizes.split(",")):
        r = measure(size, model, root, args.settle, args.window)
        print(f"{size:>5} {r['agreed']:>6.1f} {r['udp_out']:>10.2f} {r['udp_in']:>10.2f} {r['tcp_out']:>10.1f} "
              f"{r['tcp_in']:>9.1f} {r['cpu'] * 100:>6.1f}   {r['tcp_out'] / max(1, size - 1):.2f}", flush=True)


if __name__ == "__main__":
    main()
