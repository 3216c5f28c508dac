"""Ghost records: many mDNS records of a swarm, each naming an endpoint that never proves anything.

    python tests/ghost_records.py --interface 10.77.1.9 --swarm default --count 200 --base-port 9000
    python tests/ghost_records.py ... --claim-model FINGERPRINT --model-id ID   # ghosts that answer probes

What a stranger (or a buggy machine) can publish at no cost: `count` records of nodes of the
swarm, each naming its own port on this host, where a listener takes every connection, reads
what comes and never answers (a hello with a secret it cannot prove, a profile it will not
tell). With --claim-model, against an open swarm: each record is a whole profile that claims
the model (and with --claim-holds, its layers), much memory and a fast speed, and each endpoint answers the hello of a profile
fetch or liveness probe with that profile (so the ghosts stay in every node's view), while it
holds no weights and answers nothing else. Prints {"event": "ready"} once the records are up, then every second the connections
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
from discovery.profile_exchange import MAGIC as PROFILE_MAGIC  # noqa: E402
from discovery.profile_exchange import answer_profile_request  # noqa: E402
from swarm.transport.frames import MAGIC, read_magic  # noqa: E402
from swarm.transport.handshake import answer  # noqa: E402
from swarm.transport.link_handshake import LinkAuth  # noqa: E402
from swarm.transport.peer_profiles import PROFILE_PURPOSE  # noqa: E402
from swarm.transport.stream_link import StreamFrameLink  # noqa: E402


def ghost_profile(args: argparse.Namespace, i: int) -> NodeProfile:
    profile = NodeProfile(node_id=mint_node_id(), name=f"ghost-{i}", swarm=args.swarm, api_port=8800,
                          peer_port=args.base_port + i, instance=new_instance_nonce(), started_at=time.time())
    if not args.claim_model:
        return profile.as_hint()
    return profile.replace(model_id=args.model_id, model_fingerprint=args.claim_model, memory_total=64 << 30,
                           memory_available=64 << 30, speed=0.0001, extra={"state": "idle", "holds": args.claim_holds})


async def answer_probe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, profile: NodeProfile) -> None:
    """A profile fetch or probe of an open swarm answered with the ghost's claims; anything else refused."""
    magic = await asyncio.wait_for(read_magic(reader), 2.0)
    if magic == PROFILE_MAGIC:
        await answer_profile_request(reader, writer, profile)
    elif magic == MAGIC:
        auth = LinkAuth(profile.node_id, profile.swarm, None)
        answered = await answer(reader, writer, auth, {PROFILE_PURPOSE}, lambda peer, purpose: None,
                                lambda peer, purpose: None, "ghost", 2.0)
        link = StreamFrameLink(answered.peer, reader, writer)
        await link.send({"t": "profile"}, profile.to_json().encode())


async def run(args: argparse.Namespace) -> None:
    taken = 0

    profiles = [ghost_profile(args, i) for i in range(args.count)]

    def holder(profile: NodeProfile):
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal taken
            taken += 1
            try:
                if args.claim_model:
                    await answer_probe(reader, writer, profile)
                else:
                    await asyncio.wait_for(reader.read(4096), 2.0)
            except Exception:  # a refused purpose, a closed connection, a timeout: this connection only
                pass
            writer.close()
        return hold

    servers = [await asyncio.start_server(holder(p), args.interface, p.peer_port) for p in profiles]
    azc = AsyncZeroconf(interfaces=[args.interface], ip_version=IPVersion.V4Only)
    infos = []
    for profile in profiles:
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
    p.add_argument("--claim-model", default="", help="a model fingerprint: ghosts claim it and answer probes")
    p.add_argument("--model-id", default="")
    p.add_argument("--claim-holds", default="", help="the layers the ghosts say they hold: START-END")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
