"""Time to first token of one swarm node beside mlx-lm's own server: a ten-turn chat and cold long prompts.

    .venv/bin/python benchmarks/beside_mlx_server.py [--turns 10] [--rounds 1] [--cold-runs 2] [--words 1200]
                                                     [--baseline /work/main/.venv/bin/python]

On loopback: one swarm node of the default model (its defaults: prompt cache on, the backend's prefill
chunks) and `mlx_lm.server` on the same model directory (float32, as a CPU node runs it; its own
prefill_step_size, 2048) under the same BLAS, both up at once (with --baseline, a second node run by
another install, e.g. main, up too). The official openai client streams a conversation whose every
turn sends the whole history (~150 new tokens a turn, each server its own answers, greedy) to each
server in turn (the order alternating), then cold prompts of `--words` words (a new text each run).
Prints each turn's times to first token and their ratios to mlx-lm's, and the medians over rounds and
runs; the targets: turn 10 and the cold prompt at most 1.1x.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import openai  # noqa: E402

from chat_turns import paragraph, user_turn  # noqa: E402
from swarm.bench.cluster import LocalCluster, free_port  # noqa: E402
from swarm.engine.blas import find_optimized_blas, reexec_env  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402


class Server:
    def __init__(self, name: str, url: str, model: str | None = None):
        """`model`: the name to ask for (mlx_lm.server: its --model); None: the node's own."""
        self.name, self.client = name, openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                                     timeout=900)
        self.model = model or self.client.models.list().data[0].id
        self.history: list[dict] = []

    def ttft(self, messages: list[dict], max_tokens: int) -> tuple[float, str]:
        t0 = time.perf_counter()
        first, parts = None, []
        for chunk in self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=max_tokens,
                                                         temperature=0, stream=True):
            for choice in chunk.choices:
                if choice.delta.content:
                    first = first or time.perf_counter()
                    parts.append(choice.delta.content)
        return (first or time.perf_counter()) - t0, "".join(parts)


def start_mlx_server(model: Path, port: int, log: Path) -> subprocess.Popen:
    blas = find_optimized_blas()
    env = reexec_env(blas, dict(os.environ)) if blas else dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "mlx_lm.server", "--model", str(model), "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"mlx_lm.server did not listen in 300 s: {log.read_text()[-2000:]}")


def cold_prompt(seed: int, words: int) -> list[dict]:
    return [{"role": "system", "content": "You answer questions about a report. " + paragraph(seed, words)},
            {"role": "user", "content": "In one sentence, what does the report describe?"}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1, help="conversations (the ratios' medians over them)")
    ap.add_argument("--cold-runs", type=int, default=2)
    ap.add_argument("--words", type=int, default=1200)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--baseline", default=None, help="also a node run by this python (another install)")
    args = ap.parse_args()
    model = resolve_model(None, backend="cpu").path
    with tempfile.TemporaryDirectory(prefix="beside-mlx-") as tmp:
        root = Path(tmp)
        mlx = start_mlx_server(model, free_port(), root / "mlx.log")
        clusters = [("swarm", None)] + ([("baseline", args.baseline)] if args.baseline else [])
        opened = []
        try:
            servers = [Server("mlx_lm.server", f"http://127.0.0.1:{mlx.args[-1]}", str(model))]
            for name, python in clusters:
                (root / name).mkdir()
                c = LocalCluster(1, root / name, str(model), python=python, ready_timeout=600).__enter__()
                opened.append(c)
                servers.append(Server(name, c.entry.url))
            for s in servers:  # warm-up: kernels, the chat template
                s.ttft([{"role": "user", "content": "Hello there."}], 2)
            print(f"load {os.getloadavg()[0]:.1f}; turn: " + ", ".join(s.name for s in servers) + " (ttft s)",
                  flush=True)
            turns: dict[str, list[list[float]]] = {s.name: [] for s in servers}  # per round, per turn
            for r in range(args.rounds):  # (each round a conversation of its own: new notes, fresh histories)
                for s in servers:
                    s.history = []
                    turns[s.name].append([])
                for k in range(args.turns):
                    order = servers if (k + r) % 2 == 0 else servers[::-1]
                    for s in order:
                        s.history.append({"role": "user", "content": user_turn(k + 1000 * r)})
                        t, text = s.ttft(s.history, args.max_tokens)
                        s.history.append({"role": "assistant", "content": text})
                        turns[s.name][r].append(t)
                    ref = turns[servers[0].name][r][-1]
                    print(f"round {r + 1} turn {k + 1}: " + ", ".join(
                        f"{turns[s.name][r][-1]:.2f} ({turns[s.name][r][-1] / ref:.2f}x)" for s in servers), flush=True)
            colds: dict[str, list[float]] = {s.name: [] for s in servers}
            for i in range(args.cold_runs):
                order = servers if i % 2 == 0 else servers[::-1]
                for s in order:  # (a new text each run: no server has seen it)
                    colds[s.name].append(s.ttft(cold_prompt(20_000 + i, args.words),
                                                args.max_tokens)[0])
                ref = colds[servers[0].name][-1]
                print(f"cold {args.words} words, run {i + 1}: "
                      + ", ".join(f"{colds[s.name][-1]:.2f} ({colds[s.name][-1] / ref:.2f}x)" for s in servers),
                      flush=True)
            mlx_name = servers[0].name
            for s in servers[1:]:
                cold = [a / b for a, b in zip(colds[s.name], colds[mlx_name])]
                last = [a[-1] / b[-1] for a, b in zip(turns[s.name], turns[mlx_name])]
                first = [a[0] / b[0] for a, b in zip(turns[s.name], turns[mlx_name])]
                print(f"{s.name}: turn {args.turns} {statistics.median(last):.2f}x (rounds "
                      f"{', '.join(f'{c:.2f}' for c in last)}), turn 1 {statistics.median(first):.2f}x (rounds "
                      f"{', '.join(f'{c:.2f}' for c in first)}), cold {statistics.median(cold):.2f}x "
                      f"(runs {', '.join(f'{c:.2f}' for c in cold)}); load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            for c in opened:
                c.__exit__(None, None, None)
            mlx.terminate()
            mlx.wait(30)


if __name__ == "__main__":
    main()
