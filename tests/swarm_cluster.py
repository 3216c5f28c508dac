"""A real swarm for tests: one `swarm-node` process per network-namespace host.

    cluster = SwarmCluster(tmp_path, 3, ["--model", str(model_dir)])
    cluster.wait_serving(stages=3)
    status, reply = cluster.nodes[0].post("/v1/chat/completions", {...})
    cluster.close()

or, for a fixture, `with serving_swarm(tmp_path, 3, [...], stages=3) as cluster: yield cluster`.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from helpers import http_json
from netns import Host, Network, Proc
from netns_client import in_netns, sse_events

API_PORT = 8800
PEER_PORT = 8801
TEST_SPEED = "0.002"  # seconds per layer per token, stated by every test node (see SwarmNode.start)


class SwarmNode:
    def __init__(self, cluster: "SwarmCluster", host: Host, index: int, extra: list[str]):
        self.cluster, self.host, self.index, self.extra = cluster, host, index, extra
        self.url = f"http://{host.ip}:{API_PORT}"
        self.proc: Proc | None = None

    def start(self, program: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        """`program`: what runs instead of `-m swarm.cli` (a script taking its arguments, e.g. slow_member.py)."""
        # Equal stated speeds: N nodes give N equal stages, however loaded the machine is
        # (measured speeds of hosts sharing 2 cores are noise). A test may state its own.
        stated = self.cluster.stated_speed and "--speed" not in self.cluster.common + self.extra
        speed = ["--speed", TEST_SPEED] if stated else []
        interfaces = [arg for ip in self.host.ips for arg in ("--interface", ip)]  # (every LAN's, in order)
        argv = [sys.executable, *(program or ["-m", "swarm.cli"]), *interfaces, "--name", f"node{self.index}",
                "--state-dir", str(self.cluster.root / f"state{self.index}"), "--api-port", str(API_PORT),
                "--peer-port", str(PEER_PORT), *speed, *self.cluster.common, *self.extra]
        # All test hosts share this machine's cores: one BLAS thread per node, or their
        # thread pools spin against each other (measured with swarm-bench --blas-threads).
        self.proc = self.host.spawn(argv, env={"OPENBLAS_NUM_THREADS": "1", **(env or {})},
                                    label=f"node{self.index}-{time.monotonic_ns()}")

    def get(self, path: str, timeout: float = 30) -> tuple[int, dict]:
        return in_netns(self.host.ns, http_json, self.url + path, None, timeout, self.cluster.auth)

    def post(self, path: str, body: dict, timeout: float = 300) -> tuple[int, dict]:
        return in_netns(self.host.ns, http_json, self.url + path, body, timeout, self.cluster.auth)

    def stream(self, path: str, body: dict, timeout: float = 300) -> list[dict]:
        return in_netns(self.host.ns, sse_events, self.url + path, {**body, "stream": True}, timeout)

    def topology(self) -> dict | None:
        try:
            status, body = self.get("/v1/topology", timeout=5)
        except OSError:
            return None
        return body if status == 200 else None

    @property
    def node_id(self) -> str:
        return self.topology()["node_id"]


class SwarmCluster:
    def __init__(self, root: Path, n: int, common: list[str], per_node: list[list[str]] | None = None,
                 secret: str | None = None, start: bool = True, api_key: str | None = None,
                 stated_speed: bool = True, lans: int = 1):
        """`secret`: written into every node's state dir (the file a node reads its swarm secret from).
        `stated_speed` False: the nodes measure their speeds and follow them (no --speed).
        `start` False: the hosts exist, the nodes are started by the test (`node.start()`).
        `api_key`: every node's (--api-key), which get and post send. `lans`: every host is on this many
        LANs (netns.Network), with an address on each, advertised in that order."""
        self.root = Path(root)
        self.api_key, self.stated_speed = api_key, stated_speed
        self.common = common + (["--api-key", api_key] if api_key else [])
        if secret is not None:
            for i in range(n):
                (self.root / f"state{i}").mkdir(parents=True, exist_ok=True)
                (self.root / f"state{i}" / "secret").write_text(secret + "\n")
        self.network = Network(self.root / "net", lans=lans)
        try:
            hosts = self.network.add_hosts(n)
            self.nodes = [SwarmNode(self, h, i, (per_node or [[]] * n)[i]) for i, h in enumerate(hosts)]
            for node in self.nodes if start else ():
                node.start()
        except BaseException:
            self.network.close()
            raise

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def add_node(self, extra: list[str] | None = None) -> SwarmNode:
        """One more node, on a new host of the same network (started now)."""
        node = SwarmNode(self, self.network.add_host(), len(self.nodes), extra or [])
        self.nodes.append(node)
        node.start()
        return node

    def wait_serving(self, stages: int | None = None, nodes: list[SwarmNode] | None = None,
                     timeout: float = 180) -> dict:
        """Until every given node can serve on one shared plan (with `stages` stages)."""
        nodes = nodes or self.nodes
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            tops = [n.topology() for n in nodes]
            last = tops
            if all(t and t["can_serve"] and t["plan"] for t in tops):
                plan_ids = {t["plan"]["id"] for t in tops}
                if len(plan_ids) == 1 and (stages is None or len(tops[0]["plan"]["stages"]) == stages):
                    return tops[0]
            for n in nodes:
                if n.proc and n.proc.popen.poll() is not None:
                    raise RuntimeError(f"node{n.index} exited:\n{n.proc.logs(60)}")
            time.sleep(0.3)
        raise TimeoutError(f"swarm not serving with {stages} stages after {timeout}s: "
                           f"{[(t or {}).get('status') for t in last or []]}\n{self.network.logs()}")

    def restore(self, timeout: float = 180) -> dict:
        """Start again every node whose process has ended, then wait until all serve (a shared swarm,
        as the test before it may have left it)."""
        for node in self.nodes:
            if node.proc is None or node.proc.popen.poll() is not None:
                node.start()
        return self.wait_serving(stages=len(self.nodes), timeout=timeout)

    def wait_for(self, what: str, check, timeout: float, every: float = 1.0, detail=lambda: ""):
        """`check()`'s first true answer, asked every `every` s; past `timeout` a failure that shows the
        last answer, `detail()` and the nodes' log tails."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(every)
        raise AssertionError(f"{what} not within {timeout:.0f} s; last: {last}\n{detail()}{self.log_tails(tail=30)}")

    def log_tails(self, nodes: list[SwarmNode] | None = None, tail: int = 80) -> str:
        """The last `tail` lines each given node (default: every one) logged, its process's state first."""
        return "\n".join(f"=== node{n.index} (pid {n.proc.pid}, rc {n.proc.popen.poll()})\n{n.proc.logs(tail)}"
                         for n in nodes or self.nodes if n.proc is not None)

    def close(self) -> None:
        self.network.close()

    def __enter__(self) -> SwarmCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def serving_swarm(root: Path, n: int, common: list[str], *, stages: int | None = None, timeout: float = 180,
                  strangers: int = 0, **options) -> Iterator[SwarmCluster]:
    """`n` nodes serving one plan (of `stages` stages), and `strangers` hosts of the same network beside
    them with no node (`cluster.strangers`: clients, attackers); all closed after. `options`: SwarmCluster's."""
    with SwarmCluster(root, n, common, **options) as cluster:
        cluster.strangers = [cluster.network.add_host() for _ in range(strangers)]
        cluster.wait_serving(stages=stages, timeout=timeout)
        yield cluster
