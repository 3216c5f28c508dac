"""Discovery's traffic and CPU per node as a swarm grows: mDNS and probe packets per node per second.

    sudo .venv/bin/python benchmarks/discovery_traffic.py [--sizes 4,8,16,32] [--window 20]

For each size N: N netns hosts on one private bridge (tests/netns.py: nothing touches eth0), each
running `python -m discovery` (discovery only: mDNS on its own interface, the liveness probes of
every peer's peer port). Once every node has seen the other N-1 join, the kernel's counters of each
host's namespace (/proc/net/snmp) are read over `--window` seconds: UDP datagrams sent (mDNS) and
TCP segments sent (the SWPF liveness probes: connect, ask, answer, close), and each process's CPU
seconds, all per node per second. The last column is TCP segments sent per node per second per peer:
every node probes every peer, so per node that grows linearly with N, and the column stays flat as
long as it grows no worse; beyond 15 peers a node's probe rounds space out (at most 20 probes a
second: discovery/liveness.py), and the column falls.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from netns import Network, netns_unavailable_reason  # noqa: E402
from traffic import quiet_window  # noqa: E402

PEER_PORT = 7946


def measure(size: int, window: float, root: Path) -> dict[str, float]:
    net = Network(root / f"n{size}")
    try:
        hosts = net.add_hosts(size)
        procs = [h.spawn([sys.executable, "-m", "discovery", "--interface", h.ip, "--listen", h.ip, "--swarm",
                          "bench", "--peer-port", str(PEER_PORT), "--state-dir", str(root / f"s{size}-{i}"),
                          "--name", f"d{i}"], label=f"d{size}-{i}")
                 for i, h in enumerate(hosts)]
        deadline = time.monotonic() + 60 + 3 * size
        for proc in procs:
            proc.wait_event("ready", timeout=max(1.0, deadline - time.monotonic()))
        for proc in procs:  # everyone sees everyone
            while len({e["node_id"] for e in proc.events if e.get("event") == "join"}) < size - 1:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"size {size}: {proc.label} saw too few joins")
                time.sleep(0.5)
        time.sleep(3)  # the joins' own burst of announcements over
        per = quiet_window(hosts, [p.pid for p in procs], window)
        return per
    finally:
        net.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4,8,16,32")
    p.add_argument("--window", type=float, default=20.0)
    p.add_argument("--root", type=Path, default=Path("/tmp/discovery-traffic"))
    args = p.parse_args()
    if netns_unavailable_reason():
        sys.exit(f"cannot run: {netns_unavailable_reason()}")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'nodes':>5} {'mDNS out/s':>10} {'mDNS in/s':>10} {'TCP out/s':>10} {'TCP in/s':>9} {'CPU %':>6}"
          f"   per node; TCP out/s per peer")
    for size in sizes:
        r = measure(size, args.window, args.root)
        print(f"{size:>5} {r['udp_out']:>10.2f} {r['udp_in']:>10.2f} {r['tcp_out']:>10.1f} {r['tcp_in']:>9.1f} "
              f"{r['cpu'] * 100:>6.1f}   {r['tcp_out'] / max(1, size - 1):.2f}", flush=True)


if __name__ == "__main__":
    main()
