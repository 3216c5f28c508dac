"""What one liveness probe costs a node, open vs with a swarm secret: CPU time and wall time.

    python benchmarks/probe_cost.py [--probes 300] [--rounds 5]

A node probes each peer every 0.75 s (discovery/liveness.py) with ProfileFetcher
(swarm/transport/peer_profiles.py) and answers each peer's probes with its listener,
so per second it runs 2 x (peers / 0.75) probe ends. Both ends run here in one process
on one event loop over loopback, so the CPU time per probe is what the asking and the
answering node spend together: the time a probe takes the GIL from a node's MLX thread.
Rounds alternate open / secret (the machine's drift stays out of the ratio).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from discovery.profile import NodeProfile  # noqa: E402
from swarm.engine.worker import MlxWorker  # noqa: E402
from swarm.transport.lane import DataLane  # noqa: E402
from swarm.transport.link_crypto import stretch_secret  # noqa: E402
from swarm.transport.link_handshake import LinkAuth  # noqa: E402
from swarm.transport.links import PeerLinks  # noqa: E402
from swarm.transport.listener import PeerListener  # noqa: E402
from swarm.transport.peer_profiles import ProfileFetcher  # noqa: E402

HOST = "127.0.0.1"
SWARM = "bench"
SECRET = "benchmark secret, not a real one"


async def node(key: bytes | None, worker: MlxWorker) -> PeerListener:
    links = PeerLinks("answering")
    lane = DataLane("answering", SWARM, links, worker.watch, worker.post, lambda node_id: ("0.0.0.0", 0), key=key)
    profile = NodeProfile(node_id="answering", name="answering", swarm=SWARM, api_port=1, peer_port=1, speed=0.01,
                          instance="i-answering")
    listener = PeerListener("answering", SWARM, HOST, 0, links, lane, lambda: profile, key=key)
    await listener.start()
    return listener


async def probes(fetch: ProfileFetcher, port: int, n: int) -> tuple[float, float]:
    """(CPU us, wall us) per probe, both ends together."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        await fetch(HOST, port, 2.0)
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


async def main(n: int, rounds: int) -> None:
    worker = MlxWorker()
    key = stretch_secret(SECRET)
    setups = {"open": (await node(None, worker), ProfileFetcher(LinkAuth("asking", SWARM, None))),
              "secret": (await node(key, worker), ProfileFetcher(LinkAuth("asking", SWARM, key)))}
    rows = []
    print(f"{'round':>5} {'open cpu us':>12} {'secret cpu us':>14} {'open wall us':>13} {'secret wall us':>15}")
    for r in range(rounds + 1):
        row = {}
        for name, (listener, fetch) in setups.items():
            row[name] = await probes(fetch, listener.port, n)
        if r:  # round 0 warms up
            rows.append(row)
            print(f"{r:>5} {row['open'][0]:12.0f} {row['secret'][0]:14.0f} {row['open'][1]:13.0f} "
                  f"{row['secret'][1]:15.0f}", flush=True)
    med = {name: [statistics.median(r[name][i] for r in rows) for i in (0, 1)] for name in setups}
    extra = statistics.median(r["secret"][0] - r["open"][0] for r in rows)
    print(f"median CPU per probe (both ends): open {med['open'][0]:.0f} us, secret {med['secret'][0]:.0f} us, "
          f"secret - open {extra:+.0f} us; wall open {med['open'][1]:.0f} us, secret {med['secret'][1]:.0f} us")
    for peers in (1, 2):
        per_s = 2 * peers / 0.75
        print(f"a node with {peers} peer(s): {per_s:.1f} probe ends/s: open {med['open'][0] * per_s / 2 / 1e3:.2f} ms "
              f"CPU per s, secret {med['secret'][0] * per_s / 2 / 1e3:.2f} ms CPU per s")
    for listener, fetch in setups.values():
        if hasattr(fetch, "close"):
            await fetch.close()
        await listener.stop()
    worker.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--probes", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    asyncio.run(main(args.probes, args.rounds))
