"""What the prefill chunk trades: a long prompt's time alone, and a short chat's time alone and beside it.

    sudo .venv/bin/python benchmarks/long_prompt_chunks.py [--chunks 32 64 128 256] [--tokens 5000]

On 3 network-namespace hosts (tests/netns.py; root) serving the default model, no prompt cache. The
chunk is the entry's choice (`--prefill-chunk`: the chunk beside other requests; a prompt alone goes in
chunks of the larger of it and the backend's chunk for a prompt alone, entry/prompt_chunks.py), so
each node of a swarm runs another chunk and in turn
serves as the entry (after an untimed warm-up prompt): the short chat's quiet time (best of 3), a long
prompt alone, then another long prompt with the short chat sent to the same entry 1 s after it, and a
third with the short chat sent to another node. Prints per chunk: the long prompt's time alone and
with the short chat beside it, and the short chat's time beside it from each entry with its ratio to
the quiet time (the target: at most 3x).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import http_json  # noqa: E402
from netns import netns_unavailable_reason  # noqa: E402
from netns_client import in_netns  # noqa: E402
from swarm_cluster import API_PORT, SwarmCluster  # noqa: E402
from test_long_prompts_netns import QUESTION, long_chat  # noqa: E402


WARM_UP_TOKENS = 600  # a prompt each swarm reads before its first timed one (first passes are slower)


def post(client, node, body: dict, timeout: float = 900) -> tuple[dict, float]:
    t0 = time.monotonic()
    status, reply = in_netns(client.ns, http_json, f"http://{node.host.ip}:{API_PORT}/v1/chat/completions",
                             body, timeout)
    assert status == 200, reply
    return reply, time.monotonic() - t0


def beside_long(client, node, short_node, tokens: int, seed: int) -> tuple[float, float, int]:
    """A long prompt at `node` with the short chat sent to `short_node` 1 s after it: the short chat's
    time, the long prompt's, and its prompt tokens."""
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(zip(("reply", "took"),
                                                            post(client, node, long_chat(tokens, seed)))))
    thread.start()
    time.sleep(1.0)
    _, beside = post(client, short_node, QUESTION, 300)
    thread.join()
    return beside, out["took"], out["reply"]["usage"]["prompt_tokens"]


def measure(client, node, other, tokens: int, seed: int) -> tuple[float, float, float, float, float, int]:
    quiet = min(post(client, node, QUESTION, 120)[1] for _ in range(3))
    alone = post(client, node, long_chat(tokens, seed + 100))[1]
    beside, took, n = beside_long(client, node, node, tokens, seed)
    elsewhere, _, _ = beside_long(client, node, other, tokens, seed + 200)
    return quiet, beside, elsewhere, alone, took, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--tokens", type=int, default=5000)
    args = ap.parse_args()
    if reason := netns_unavailable_reason():
        sys.exit(reason)
    rows = []
    groups = [args.chunks[i:i + 3] for i in range(0, len(args.chunks), 3)]
    for g, chunks in enumerate(groups):
        with tempfile.TemporaryDirectory() as tmp, \
                SwarmCluster(Path(tmp), 3, ["--prompt-cache", "0", "--token-timeout", "120"],
                             per_node=[["--prefill-chunk", str(c)] for c in chunks] + [[]] * (3 - len(chunks))) \
                as cluster:
            client = cluster.network.add_host()
            cluster.wait_serving(stages=3, timeout=300)
            post(client, cluster.nodes[0], long_chat(min(args.tokens, WARM_UP_TOKENS), seed=999))  # (untimed)
            for i, chunk in enumerate(chunks):
                quiet, beside, elsewhere, alone, took, n = measure(client, cluster.nodes[i], cluster.nodes[(i + 1) % 3],
                                                                   args.tokens, seed=10 * g + i)
                rows.append((chunk, n, alone, took, quiet, beside, elsewhere))
                print(f"chunk {chunk}: {n}-token prompt {alone:.1f}s alone, {took:.1f}s with the short chat; "
                      f"short chat {quiet:.2f}s alone, {beside:.2f}s beside ({beside / quiet:.2f}x), "
                      f"{elsewhere:.2f}s beside from another entry ({elsewhere / quiet:.2f}x)", flush=True)
    print(f"\n{'chunk':>5} {'prompt tok':>10} {'alone s':>8} {'long s':>7} {'quiet s':>8} {'beside s':>9} {'ratio':>6}"
          f" {'other entry s':>13} {'ratio':>6}")
    for chunk, n, alone, took, quiet, beside, elsewhere in rows:
        print(f"{chunk:>5} {n:>10} {alone:>8.1f} {took:>7.1f} {quiet:>8.2f} {beside:>9.2f} {beside / quiet:>5.2f}x"
              f" {elsewhere:>13.2f} {elsewhere / quiet:>5.2f}x")


if __name__ == "__main__":
    main()
