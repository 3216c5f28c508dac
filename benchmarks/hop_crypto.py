"""Where a hop's time goes with and without a swarm secret, inside the nodes: seal / open per frame.

    d=$(mktemp -d)
    SWARM_CRYPTO_TIMING=$d PYTHONPATH=$PWD/benchmarks/crypto_hook \\
        python benchmarks/ab_hop.py --a .venv/bin/python --b .venv/bin/python --b-args="--secret <32+ chars>"
    python benchmarks/hop_crypto.py $d

benchmarks/crypto_hook/sitecustomize.py times, in every node of both swarms, the frame
writer (`write`: the whole PeerConnection.write_frame) and the encode or seal inside it
(`pack`), the frame reader (`read`: one PeerConnection.read_frames that returned
frames) and the parse or open inside it (`unpack`). This prints their medians per
frame kind (the decode step's hidden states, the token back), open against sealed,
and what a hop pays more: write + read of the hidden-state frame. `aead` / `aead-open`: the
AEAD call inside (FrameSealer.seal_into, FrameOpener.open). The CPU columns are the thread's CPU
time over the same steps: equal to the wall time means the thread ran throughout (not preempted).
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main() -> int:
    d = Path(sys.argv[1])
    samples: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    cpu: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    for path in d.glob("*.crypto"):
        for line in path.read_text().splitlines():
            what, sealed, n, ns, *rest = line.split()
            n = int(n)
            if what == "read" and n == 0:
                continue  # a read that returned no frames (or only payload-less ones)
            kind = "hidden states" if n >= 1024 else "token (small)"
            samples[(what, int(sealed), kind)].append(int(ns) / 1e3)
            if rest and int(rest[0]) >= 0:
                cpu[(what, int(sealed), kind)].append(int(rest[0]) / 1e3)
    print("| per frame, µs (median; count) | open | sealed | sealed - open | CPU open | CPU sealed "
          "| CPU sealed - open |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    med = statistics.median
    for kind in ("hidden states", "token (small)"):
        for what in ("pack", "aead", "write", "unpack", "aead-open", "read"):
            o, s = samples.get((what, 0, kind)), samples.get((what, 1, kind))
            if not s:
                continue
            co, cs = cpu.get((what, 0, kind)), cpu.get((what, 1, kind))
            row = f"| {kind}: {what} | {med(o):.1f} ({len(o)}) |" if o else f"| {kind}: {what} | |"
            row += f" {med(s):.1f} ({len(s)}) | {med(s) - med(o):+.1f} |" if o else f" {med(s):.1f} ({len(s)}) | |"
            row += f" {med(co):.1f} |" if co else " |"
            row += f" {med(cs):.1f} |" if cs else " |"
            row += f" {med(cs) - med(co):+.1f} |" if co and cs else " |"
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
