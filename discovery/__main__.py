"""`python -m discovery`: run discovery standalone and print events as JSON lines.

stdout carries one JSON object per line: first {"event": "ready", ...}, then
{"event": "join"|"update"|"leave"|"remint", "node_id": ..., "profile": {...},
"addresses": [...]}. Logs go to stderr.

stdin may carry commands, one JSON object per line, for tests and debugging:
{"update": {"plan": "p1", "layers": "0-15"}} calls update_profile(**fields).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from .discovery import Discovery
from .liveness import serve_liveness_port
from .local_profile import build_local_profile
from .memory import parse_size
from .static_peers import parse_peer_address


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m discovery", description=__doc__.splitlines()[0])
    p.add_argument("--name", help="display name (default: hostname)")
    p.add_argument("--swarm", default="default", help="swarm name; nodes of other swarms are ignored")
    p.add_argument("--interface", action="append", dest="interfaces", metavar="IP_OR_NAME",
                   help="restrict mDNS to this interface (repeatable; default: all)")
    p.add_argument("--peer", action="append", dest="peers", default=[], metavar="HOST:PORT",
                   type=parse_peer_address, help="static peer's peer port (repeatable)")
    p.add_argument("--no-mdns", action="store_true", help="static peers only")
    p.add_argument("--peer-port", type=int, default=7946, help="port of the peer/liveness listener")
    p.add_argument("--api-port", type=int, default=8000, help="API port to advertise")
    p.add_argument("--state-dir", type=Path, default=Path(os.environ.get("SWARM_STATE_DIR", "~/.swarm")).expanduser())
    p.add_argument("--speed", type=float, default=0.0, help="seconds per layer per token")
    p.add_argument("--memory-limit", type=parse_size, help="cap advertised available memory, e.g. 8G")
    p.add_argument("--model-id", default="", help="model id to advertise")
    p.add_argument("--listen", default=None, help="address for the peer listener (default: all)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


async def follow_stdin_commands(discovery: Discovery) -> None:
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        try:
            command = json.loads(line)
            await discovery.update_profile(**command["update"])
        except Exception as exc:  # a bad command must not kill the node
            logging.getLogger("discovery.cli").warning("ignoring command %r: %s", line.strip(), exc)


def print_line(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


async def run(args: argparse.Namespace) -> None:
    profile = build_local_profile(
        state_dir=args.state_dir, swarm=args.swarm, name=args.name, api_port=args.api_port,
        peer_port=args.peer_port, speed=args.speed, model_id=args.model_id, memory_limit=args.memory_limit,
    )
    discovery = Discovery(
        profile, interfaces=args.interfaces, static_peers=args.peers, mdns=not args.no_mdns,
        on_event=lambda event: print_line(event.to_dict()), state_dir=args.state_dir,
    )
    server = await serve_liveness_port(args.listen, args.peer_port, lambda: discovery.profile)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await discovery.start()
        print_line({"event": "ready", "node_id": discovery.node_id, "profile": discovery.profile.to_dict()})
        commands = asyncio.create_task(follow_stdin_commands(discovery))
        await stop.wait()
        commands.cancel()
    finally:
        await discovery.stop()  # sends mDNS goodbyes
        server.close()
        await server.wait_closed()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("zeroconf").setLevel(logging.WARNING)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
