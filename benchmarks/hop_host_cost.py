"""The host's CPU time on one hop's path, without any model compute: what each added stage costs a step.

    python benchmarks/hop_host_cost.py [--rounds 5] [--steps 2000]
    /work/main/.venv/bin/python benchmarks/hop_host_cost.py     # another build's (its install's `swarm`)

Run from outside a checkout with another interpreter, it measures the build that interpreter imports,
so two builds compare on the same machine at the same time (alternate them: the machine is shared).
Each row is the median over rounds of the calling thread's own CPU time per step (time.thread_time:
a machine busy with other work does not inflate it), in microseconds:

- frame out + in: a decode step's Forward (a hidden state of --hidden floats) through the data lane
  (transport/lane.py) over a loopback TCP connection: encode, sendmsg, recv, parse, decode into a
  message, hand it to the handler. Likewise the last stage's Token back to the entry.
- entry step: the entry's per-token bookkeeping on its event loop (entry/swarm_pipeline.py): build the
  step, post it, wait for its token (answered at once, by a callback), record the timing; with and
  without the overdue-step watch.
- attempt check: a stage's check of the request's attempt (engine/request_attempts.py) per frame.

Only loopback is used.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import socket
import statistics
import time

import numpy as np

from partitioner import Plan
from partitioner.model import ModelSpec, Stage
from swarm.engine.sampling import SamplingParams
from swarm.entry.hop_timing import HopTiming
from swarm.entry.own_requests import OwnRequests
from swarm.entry.pending_tokens import PendingTokens
from swarm.entry.run_ahead import RunAhead
from swarm.entry.swarm_pipeline import SwarmPipeline
from swarm.transport.connection import PeerConnection
from swarm.transport.lane import DataLane
from swarm.transport.links import PeerLinks
from swarm.transport.messages import Forward, Token

HOST = "127.0.0.1"
GREEDY = SamplingParams(temperature=0.0)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server((HOST, 0)) as server:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    return a, b


class LanePair:
    """Two data lanes, "a" and "b", joined by one loopback connection; both driven from this thread."""

    def __init__(self) -> None:
        sa, sb = _tcp_pair()
        self.readers: dict = {}
        self.got: list = []
        self.a = self._lane("a", "b", PeerConnection(sa, "b", "b", dialed=True))
        self.b = self._lane("b", "a", PeerConnection(sb, "a", "a", dialed=False))
        self.sock_a, self.sock_b = sa, sb

    def _lane(self, me: str, peer: str, conn: PeerConnection) -> DataLane:
        links = PeerLinks(me)
        links.admit(peer)
        links.arrived(conn)
        lane = DataLane(me, "bench", links, self.readers.__setitem__, lambda fn, *args: fn(*args),
                        {peer: (HOST, 1)}.get)
        lane.serve(lambda sender, message: self.got.append(message))
        lane.take_over(conn, None)
        return lane

    def a_to_b(self, message) -> None:
        self.a.mlx_send("b", message)
        self.readers[self.sock_b]()

    def b_to_a(self, message) -> None:
        self.b.mlx_send("a", message)
        self.readers[self.sock_a]()


def per_step_us(fn, steps: int) -> float:
    t0 = time.thread_time()
    for i in range(steps):
        fn(i)
    return (time.thread_time() - t0) / steps * 1e6


def lane_rows(steps: int, hidden: int) -> dict[str, float]:
    pair = LanePair()
    state = np.random.default_rng(0).standard_normal((1, 1, hidden), dtype=np.float32)
    data = memoryview(state.tobytes())

    def forward(i: int) -> None:
        pair.a_to_b(Forward("r1", "p1", 100 + i, 10, "a", GREEDY, "float32", (1, 1, hidden), data))
        pair.got.clear()

    def token(i: int) -> None:
        pair.b_to_a(Token("r1", "p1", 101 + i, 42, 1234))
        pair.got.clear()

    rows = {"frame out + in: Forward (hidden state)": per_step_us(forward, steps),
            "frame out + in: Token": per_step_us(token, steps)}
    for s in (pair.sock_a, pair.sock_b):
        s.close()
    return rows


class AnswerAtOnce:
    """The outbox of a swarm whose stages cost nothing: each step's token comes back on the next loop turn."""

    def __init__(self, pending: PendingTokens) -> None:
        self.pending = pending

    def post(self, node_id: str, forward: Forward) -> None:
        token = Token(forward.rid, forward.plan_id, forward.pos + forward.length, 42, 0, None,
                      *((forward.attempt,) if hasattr(forward, "attempt") else ()))
        asyncio.get_running_loop().call_soon(self.pending.resolve, token)

    def post_release(self, *args, **kwargs) -> None:
        pass


class Watch:
    """An overdue-step watch that never fires (its threshold is far off)."""

    def overdue_after(self, plan: Plan, positions: int) -> float:
        return 30.0

    def step_overdue(self, plan: Plan, why: str) -> None:
        raise AssertionError(why)


def entry_us(steps: int, watched: bool) -> float:
    if watched and "watch" not in inspect.signature(SwarmPipeline).parameters:
        return float("nan")  # a build without the watch
    plan = Plan(ModelSpec(30, 1), "balanced", (Stage("s1", 0, 10), Stage("s2", 10, 20), Stage("s3", 20, 30)),
                (), 0.0, "p1")

    async def run() -> float:
        pending = PendingTokens()
        pipeline = SwarmPipeline(plan, "entry", AnswerAtOnce(pending), pending, 120.0, HopTiming(),
                                 RunAhead("entry"), OwnRequests(), **({"watch": Watch()} if watched else {}))
        await pipeline.forward("r1", [1, 2, 3], 0, GREEDY)
        t0 = time.thread_time()
        for i in range(steps):
            await pipeline.forward("r1", [7], 3 + i, GREEDY)
        took = time.thread_time() - t0
        await pipeline.release("r1")
        return took / steps * 1e6

    return asyncio.run(run())


def attempt_us(steps: int) -> float:
    try:
        from swarm.engine.request_attempts import RequestAttempts
    except ImportError:
        return float("nan")
    attempts = RequestAttempts()
    key = ("entry", "r1")
    return per_step_us(lambda i: attempts.admits(key, 0, lambda: None), steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--hidden", type=int, default=576, help="hidden size (SmolLM2-135M's: 576)")
    args = p.parse_args()
    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        rows = lane_rows(args.steps, args.hidden)
        rows["entry step, overdue watch off"] = entry_us(args.steps, False)
        rows["entry step, overdue watch on"] = entry_us(args.steps, True)
        rows["attempt check (per frame at a stage)"] = attempt_us(args.steps * 10)
        for name, value in rows.items():
            samples.setdefault(name, []).append(value)
    import swarm
    print(f"swarm from {swarm.__file__.rsplit('/', 2)[0]}, median of {args.rounds} rounds of {args.steps} steps\n")
    print("| what | host CPU us per step |\n|---|---:|")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values):.1f} |")


if __name__ == "__main__":
    main()
