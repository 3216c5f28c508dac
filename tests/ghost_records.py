"""Ghost records: many mDNS records of a swarm, each naming an endpoint that never proves anything.

    python tests/ghost_records.py --interface 10.77.1.9 --swarm default --count 200 --base-port 9000

What a stranger (or a buggy machine) can publish at no cost: `count` records of nodes of the
swarm, each naming its own port on this host, where a listener takes every connection, reads
what comes and never answers (a hello with a secret it cannot prove, a profile it will not
tell). Prints {"event": "ready"} once the records are up, then every second the connections
its endpoints took so far ({"event": "count", "connections": N}). For tests in network
namespaces only: mDNS on the given interface. Bounded: it exits after --seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zeroconf import IPVersion  # noqa: E402
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf  # noqa: E402

from discovery.node_id import mint_node_id, new_instance_nonce  # noqa: E402
from discovery.profile import SERVICE_TYPE, NodeProfile  # noqa: E402


async def run(args: argparse.Namespace) -> None:
    taken = 0

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal taken
        taken += 1
        try:
            await asyncio.wait_for(reader.read(4096), 2.0)
        except (asyncio.TimeoutError, OSError):
            pass
        writer.close()

    servers = [await asyncio.start_server(hold, args.interface, args.base_port + i) for i in range(args.count)]
    azc = AsyncZeroconf(interfaces=[args.interface], ip_version=IPVersion.V4Only)
    infos = []
    for i in range(args.count):
        profile = NodeProfile(node_id=mint_node_id(), name=f"ghost-{i}", swarm=args.swarm, api_port=8800,
                              peer_port=args.base_port + i, instance=new_instance_nonce(),
                              started_at=time.time()).as_hint()
        infos.append(AsyncServiceInfo(SERVICE_TYPE, f"ghost-{profile.instance}.{SERVICE_TYPE}",
                                      addresses=[socket.inet_aton(args.interface)], port=profile.peer_port,
                                      properties=profile.to_txt(), server=f"ghost-{profile.instance}.local."))
    registered = await asyncio.gather(*(azc.async_register_service(info) for info in infos))
    await asyncio.gather(*registered)  # each probes for its name first, all at once
    print(json.dumps({"event": "ready", "records": len(infos)}), flush=True)
    try:
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            print(json.dumps({"event": "count", "connections": taken, "t": time.monotonic()}), flush=True)
    finally:
        await azc.async_unregister_all_services()
        await azc.async_close()
        for server in servers:
            server.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--interface", required=True)
    p.add_argument("--swarm", default="default")
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--base-port", type=int, default=9000)
    p.add_argument("--seconds", type=float, default=60.0)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
