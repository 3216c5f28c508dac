"""A rogue "node" for attack tests: an mDNS record and a peer-port responder, no weights at all.

    python tests/hostile_peer.py --ip 10.77.1.4 --swarm default --fingerprint FP --model-id ID

It advertises `_swarm._tcp.local.` on `--ip` only (zeroconf with explicit interfaces:
never the machine's real network) with a profile of the same swarm and model as
its victims, a huge memory and a tiny time per layer, so that a planner that
trusts it gives it every layer. On its peer port it answers like a node would:
  b"SWPF"  -> the same profile (the plain profile exchange and liveness probe)
  b"SWRM"  -> a hello of its own (with a made-up nonce and proof, so a node that
              asks for a proof gets one that is wrong), then it reads and reports
              every frame it is sent, keeping the connection open
It prints JSON lines: {"event": "ready", ...}, then {"event": "hello", "from": ...,
"purpose": ...} and {"event": "frame", "t": ..., "from": ...} as they come.
It changes nothing in the repo's code: what it says is what today's rogue said.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

import msgpack
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from discovery.profile import PROTOCOL_VERSION, SERVICE_TYPE, NodeProfile  # noqa: E402
from stranger import PREFIX, frame  # noqa: E402  (this script's own folder, tests/, is on its path)


def say(**event) -> None:
    sys.stdout.write(json.dumps(event, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict, bytes]:
    header_len, payload_len = PREFIX.unpack(await reader.readexactly(PREFIX.size))
    if header_len > 65536 or payload_len > 64 * 1024 * 1024:
        raise ValueError("oversized frame")
    header = msgpack.unpackb(await reader.readexactly(header_len), raw=False)
    return header, await reader.readexactly(payload_len)


class Rogue:
    def __init__(self, profile: NodeProfile) -> None:
        self.profile = profile

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            magic = await asyncio.wait_for(reader.readexactly(4), 5)
            if magic == b"SWPF":
                body = self.profile.to_json().encode()
                writer.write(struct.pack(">I", len(body)) + body)
                await writer.drain()
            elif magic == b"SWRM":
                hello, _ = await asyncio.wait_for(read_frame(reader), 5)
                say(event="hello", peer=str(peer), **{"from": hello.get("node_id"), "purpose": hello.get("purpose")})
                answer = {"t": "hello", "v": hello.get("v", PROTOCOL_VERSION), "node_id": self.profile.node_id,
                          "swarm": self.profile.swarm}
                for key in ("purpose",):
                    if key in hello:
                        answer[key] = hello[key]
                if "nonce" in hello:  # it wants a proof: here is one, made up
                    answer["nonce"], answer["proof"] = os.urandom(32), os.urandom(32)
                writer.write(frame(answer))
                if hello.get("purpose") == "profile":
                    writer.write(frame({"t": "profile"}, self.profile.to_json().encode()))
                await writer.drain()
                while True:
                    header, payload = await read_frame(reader)
                    say(event="frame", t=header.get("t"), bytes=len(payload), **{"from": hello.get("node_id")})
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, OSError, ValueError, TypeError):
            pass
        finally:
            writer.close()


async def main(args: argparse.Namespace) -> None:
    instance = os.urandom(8).hex()
    profile = NodeProfile(
        node_id=args.node_id, name="rogue", swarm=args.swarm, api_port=8800, peer_port=args.port,
        backend="cpu", memory_total=2**40, memory_available=2**40, speed=1e-6, model_id=args.model_id,
        model_fingerprint=args.fingerprint, instance=instance, started_at=time.time() - 3600,
        extra={"state": "serving"},
    )
    rogue = Rogue(profile)
    server = await asyncio.start_server(rogue.serve, args.ip, args.port)
    azc = AsyncZeroconf(interfaces=[args.ip])
    info = AsyncServiceInfo(SERVICE_TYPE, f"swarm-{instance}.{SERVICE_TYPE}", port=args.port,
                            addresses=[socket.inet_aton(args.ip)], properties=profile.to_txt(),
                            server=f"swarm-{instance}.local.")
    await (await azc.async_register_service(info))
    say(event="ready", node_id=profile.node_id)
    try:
        await asyncio.sleep(args.seconds)
    finally:
        await azc.async_unregister_all_services()
        await azc.async_close()
        server.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ip", required=True, help="the address to advertise and listen on (a test host's)")
    p.add_argument("--port", type=int, default=8801)
    p.add_argument("--swarm", default="default")
    p.add_argument("--fingerprint", required=True, help="the victims' model fingerprint (public in /v1/topology)")
    p.add_argument("--model-id", default="")
    p.add_argument("--node-id", default="rogue-0000")
    p.add_argument("--seconds", type=float, default=600, help="stop by itself after this long")
    asyncio.run(main(p.parse_args()))
