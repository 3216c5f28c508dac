"""N local `swarm-node` processes on loopback that find each other by static peers.

Every socket is on 127.0.0.1 and mDNS is off: a benchmark must never multicast
on the machine's real interfaces. Nodes are split evenly on purpose (strategy
`memory`, equal memory limits): the balanced planner would rightly keep a
small model on one node of one machine, and per-hop overhead is only
comparable when every setup does the same compute per token.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"


_GIVEN_KEPT = 4096
_given: OrderedDict[int, None] = OrderedDict()  # the ports handed out last, oldest first


def free_port() -> int:
    """A loopback port free now and not handed out lately by this process: the kernel may give again a
    port it gave a moment ago, which the node it was for has not bound yet."""
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in _given:
            _given[port] = None
            if len(_given) > _GIVEN_KEPT:
                _given.popitem(last=False)
            return port


def get_json(url: str, timeout: float = 5.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@dataclass
class LocalNode:
    index: int
    node_id: str
    api_port: int
    peer_port: int
    log: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.api_port}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class LocalCluster:
    """Context manager: start n nodes, wait until they serve one n-stage plan, stop them all."""

    def __init__(self, n: int, workdir: Path, model: str | None, memory_limit: str = "2G",
                 ready_timeout: float = 300.0, log_level: str = "WARNING", extra_args: tuple[str, ...] = (),
                 python: str | None = None, node_env: dict[int, dict[str, str]] | None = None):
        """`node_env`: more environment for the node of an index (e.g. CUDA_VISIBLE_DEVICES, one card each)."""
        self.n, self.workdir, self.model, self.extra_args = n, workdir, model, tuple(extra_args)
        self.node_env = node_env or {}
        self.python = os.path.abspath(python) if python else sys.executable  # another install's swarm
        self.memory_limit, self.ready_timeout, self.log_level = memory_limit, ready_timeout, log_level
        # One swarm name per cluster: a straggler from an earlier setup can never join this one.
        self.swarm = f"bench-{os.getpid()}-{n}-{time.monotonic_ns() % 10**6}"
        self.nodes = [LocalNode(i, f"bench-node-{i}", free_port(), free_port(), workdir / f"node{n}-{i}.log")
                      for i in range(n)]
        self.topology: dict = {}

    def __enter__(self) -> "LocalCluster":
        try:
            for node in self.nodes:
                self._spawn(node)
            self.topology = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def _spawn(self, node: LocalNode) -> None:
        peers = [a for other in self.nodes if other is not node for a in ("--peer", f"{HOST}:{other.peer_port}")]
        # state-<i> is shared by the setups of one run, so each node measures its speed once.
        argv = [self.python, "-m", "swarm.cli", "--no-mdns", "--api-host", HOST, "--peer-host", HOST,
                "--api-port", str(node.api_port), "--peer-port", str(node.peer_port), *peers,
                "--node-id", node.node_id, "--name", node.node_id, "--swarm", self.swarm,
                "--state-dir", str(self.workdir / f"state-{node.index}"), "--strategy", "memory",
                "--memory-limit", self.memory_limit, "--log-level", self.log_level, *self.extra_args]
        if self.model:
            argv += ["--model", self.model]
        with open(node.log, "w") as out:
            # cwd: `-m` puts it first on sys.path, so a source tree there would shadow the install's swarm
            node.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.workdir, env={**os.environ, **self.node_env.get(node.index, {})})

    def _wait_ready(self) -> dict:
        """Every node serves the same plan, and that plan has n stages."""
        deadline = time.monotonic() + self.ready_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"{node.node_id} exited with {node.proc.returncode}:\n{self.tail(node)}")
            try:
                plans = set()
                for node in self.nodes:
                    status, body = get_json(node.url + "/health")
                    plans.add(body.get("plan_id") if status == 200 else None)
                    last = f"{node.node_id}: {body.get('status')}"
                if len(plans) == 1 and None not in plans:
                    status, topo = get_json(self.nodes[0].url + "/v1/topology")
                    if status == 200 and topo.get("plan") and len(topo["plan"]["stages"]) == self.n:
                        return topo
                    last = f"plan has {len((topo.get('plan') or {}).get('stages', []))} stages, want {self.n}"
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{self.n} nodes not serving one {self.n}-stage plan after {self.ready_timeout:.0f}s "
                           f"({last}):\n" + "\n".join(self.tail(n) for n in self.nodes))

    def tail(self, node: LocalNode, lines: int = 20) -> str:
        try:
            return f"--- {node.log}\n" + "\n".join(node.log.read_text().splitlines()[-lines:])
        except OSError:
            return f"--- {node.log}: no log"

    @property
    def stages(self) -> list[dict]:
        """[{node_id, start, end}] in pipeline order."""
        return self.topology["plan"]["stages"]

    @property
    def entry(self) -> LocalNode:
        """Stage 0's node: requests enter there, so its first hop is a local call."""
        first = self.stages[0]["node_id"]
        return next(n for n in self.nodes if n.node_id == first)

    def pids(self) -> dict[str, int]:
        return {n.node_id: n.proc.pid for n in self.nodes if n.proc}
