"""Time to first token of one node beside mlx-lm's own server: a ten-turn chat and a cold long prompt.

    .venv/bin/python benchmarks/beside_mlx_server.py [--turns 10] [--words 1200] [--rounds 2] [--before /work/main]

On loopback only (no mDNS): `mlx_lm.server` and a `swarm-node` serving the default model, both up at
once, under the same BLAS (the optimized one a node re-executes itself with, one BLAS thread each), and
with `--before TREE` a second node run from another checkout's code (the figures before a change).
Each round streams the same ten-turn conversation (the whole history every turn, greedy answers,
tests/chat_turns.py) to every server, turns interleaved, then one cold prompt of `--words` words (new
text each round) to each. Prints per turn and server the prompt's tokens and the time to first token,
and the node's ratio to mlx-lm's (the target: at most 1.1x at turn 10 and on the cold prompt).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chat_turns import paragraph, user_turn  # noqa: E402
from node_process import start_node  # noqa: E402
from reference import node_blas, node_blas_env  # noqa: E402
from swarm.bench.cluster import free_port, get_json  # noqa: E402


class Server:
    def __init__(self, name: str, url: str, model: str, stop):
        self.name, self.url, self.model, self.stop = name, url, model, stop
        self.messages: list[dict] = []


def mlx_server(model_dir: Path, env: dict, log: Path) -> Server:
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir), "--host",
                                 "127.0.0.1", "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if get_json(url + "/health")[0] == 200:
                break
        except (OSError, ValueError):
            time.sleep(0.5)
    else:
        proc.kill()
        raise SystemExit(f"mlx_lm.server did not start:\n{log.read_text()}")

    def stop() -> None:
        proc.terminate()
        proc.wait(30)
    return Server("mlx_lm.server", url, "default_model", stop)


def swarm_node(name: str, root: Path, env: dict, tree: Path | None) -> Server:
    if tree is not None:
        env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))}
    root.mkdir(parents=True, exist_ok=True)
    node = start_node(root, "--token-timeout", "900", env=env)
    node.wait_ready(600)
    model = get_json(node.url + "/v1/models")[1]["data"][0]["id"]

    def stop() -> None:
        node.stop()
    return Server(name, node.url, model, stop)


def ttft(server: Server, messages: list[dict], max_tokens: int) -> tuple[float, str, int]:
    """(seconds to the first streamed text, the text, prompt tokens) of a greedy streamed chat."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=900)
    t0 = time.perf_counter()
    first, parts, usage = None, [], None
    print(f"{server.name}: {len(messages)} messages", file=sys.stderr, flush=True)
    for chunk in client.chat.completions.create(model=server.model, messages=messages, max_tokens=max_tokens,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.perf_counter()
                parts.append(choice.delta.content)
    return (first or time.perf_counter()) - t0, "".join(parts), usage.prompt_tokens if usage else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--words", type=int, default=1200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--before", type=Path, help="also run a node from this checkout's code (e.g. /work/main)")
    ap.add_argument("--logs", type=Path, help="keep the servers' logs in this folder")
    args = ap.parse_args()
    from swarm.models.resolve import resolve_model
    model_dir = Path(resolve_model(None).path)
    blas = node_blas()
    env = node_blas_env(blas) if blas else {**os.environ}
    env["OPENBLAS_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        root = args.logs or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        servers = [mlx_server(model_dir, env, root / "mlx_server.log")]
        try:
            servers.append(swarm_node("swarm node", root / "node", {"OPENBLAS_NUM_THREADS": "1"}, None))
            if args.before:
                servers.append(swarm_node("node before", root / "before", {"OPENBLAS_NUM_THREADS": "1"}, args.before))
            ttft(servers[0], [{"role": "user", "content": "Hello"}], 2)  # (first passes are slower)
            for s in servers[1:]:
                ttft(s, [{"role": "user", "content": "Hello"}], 2)
            rows: list[tuple[str, list[tuple[float, int]]]] = []
            for r in range(args.rounds):
                for s in servers:
                    s.messages = []
                for k in range(args.turns):
                    row = []
                    for s in servers:
                        s.messages.append({"role": "user", "content": user_turn(k + 100 * r)})
                        took, text, n = ttft(s, s.messages, args.max_tokens)
                        s.messages.append({"role": "assistant", "content": text})
                        row.append((took, n))
                    rows.append((f"r{r + 1} turn {k + 1}", row))
                cold = [{"role": "user", "content": paragraph(50_000 + r, args.words)
                         + "\nIn one sentence, what is this text about?"}]
                rows.append((f"r{r + 1} cold", [ttft(s, cold, args.max_tokens)[::2] for s in servers]))
        finally:
            for s in servers:
                s.stop()
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (2-core machine shared)")
    print(f"{'':>14} " + " ".join(f"{s.name + ' tokens/ttft s':>28}" for s in servers)
          + " " + " ".join(f"{s.name + ' / mlx':>18}" for s in servers[1:]))
    for name, row in rows:
        print(f"{name:>14} " + " ".join(f"{f'{n} / {t:.2f}':>28}" for t, n in row)
              + " " + " ".join(f"{t / row[0][0]:>17.2f}x" for t, _ in row[1:]))


if __name__ == "__main__":
    main()
