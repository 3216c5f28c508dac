"""A fake swarm member: an mDNS record and a profile responder, nothing else. It never serves.

    python tests/fake_member.py --interface 10.77.1.5 --swarm default --fingerprint FP \
        [--node-id ID] [--started-at UNIX_TIME] [--speed 0.00001] [--memory 1T] [--model-dir DIR]

What issue 19's stranger ran: a record of a fast node with a lot of memory and the swarm's
model fingerprint (both in every honest node's TXT record), so every plan gives it layers it
will never load (a "black hole"); with --node-id an honest node's id and an earlier
--started-at, it also claims that node's id. Its peer port is a real PeerListener, so it
answers profile requests and liveness probes as any node of an open swarm does (whatever form
they take), and stays in every view; it has no data lane. With --model-dir it holds the model's
files and proves it (weights/layer_proof.py), as an honest holder does: planners that plan only
proven peers plan it, and it still never serves. Prints {"event": "ready", ...} as a
JSON line, then runs until SIGTERM. For tests in network namespaces only: mDNS on the given
interface.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from discovery import Discovery  # noqa: E402
from discovery.memory import parse_size  # noqa: E402
from discovery.node_id import mint_node_id, new_instance_nonce  # noqa: E402
from discovery.profile import NodeProfile  # noqa: E402
from swarm.transport.links import PeerLinks  # noqa: E402
from swarm.transport.listener import PeerListener  # noqa: E402
from swarm.models.manifest import build_manifest  # noqa: E402
from swarm.weights.layer_proof import PROVE_PURPOSE, serve_proofs  # noqa: E402
from swarm.weights.store import ChunkStore  # noqa: E402


class _NoLane:
    """A fake has no data lane: a data link offered to it fails (a black hole takes no frames)."""

    def retire_idle(self, _idle_s: float) -> None:
        pass


async def run(args: argparse.Namespace) -> None:
    memory = parse_size(args.memory)
    profile = NodeProfile(
        node_id=args.node_id or mint_node_id(), name=args.name, swarm=args.swarm, api_port=args.api_port,
        peer_port=args.peer_port, memory_total=memory, memory_available=memory, speed=args.speed,
        model_id=args.model_id, model_fingerprint=args.fingerprint, instance=new_instance_nonce(),
        started_at=args.started_at if args.started_at is not None else time.time(),
        extra={"state": "serving", "plan": "never-this-one"})
    store = None
    if args.model_dir:
        store = ChunkStore.complete(Path(args.model_dir), build_manifest(Path(args.model_dir)))
        n_layers = json.loads((Path(args.model_dir) / "config.json").read_text())["num_hidden_layers"]
        profile = profile.replace(holds=f"0-{n_layers}")
    discovery = Discovery(profile, interfaces=[args.interface], mdns=True, state_dir=None)
    listener = PeerListener(profile.node_id, args.swarm, args.interface, args.peer_port, PeerLinks(profile.node_id),
                            _NoLane(), lambda: discovery.profile)  # type: ignore[arg-type]
    if store is not None:
        listener.serve_purpose(PROVE_PURPOSE, serve_proofs(lambda: store))
    await listener.start()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await discovery.start()
        print(json.dumps({"event": "ready", "node_id": discovery.node_id}), flush=True)
        await stop.wait()
    finally:
        await discovery.stop()
        await listener.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--interface", required=True)
    p.add_argument("--swarm", default="default")
    p.add_argument("--fingerprint", required=True)
    p.add_argument("--model-id", default="fake")
    p.add_argument("--node-id", default=None)
    p.add_argument("--name", default="black-hole")
    p.add_argument("--started-at", type=float, default=None)
    p.add_argument("--speed", type=float, default=0.00001)
    p.add_argument("--memory", default="1T")
    p.add_argument("--peer-port", type=int, default=8801)
    p.add_argument("--api-port", type=int, default=8800)
    p.add_argument("--model-dir", default=None, help="hold this model's files and prove it")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
