"""Multi-host test harness: real hosts as Linux network namespaces.

    net = Network(log_dir)              # a bridge in a namespace of its own
    h1, h2 = net.add_host(), net.add_host()
    proc = h1.spawn([sys.executable, "-m", "discovery", ...])
    proc.wait_for(lambda e: e["event"] == "ready", timeout=5)
    h2.link_down(); h2.link_up()
    net.close()                         # kills processes, deletes namespaces

Every host is a namespace `sw<run>-h<i>` with its own lo and an eth0 that is
one end of a veth pair; the other end sits on bridge br0 in `sw<run>-br`.
`Network(log_dir, lans=2)` gives every host a second address on a second LAN
(eth1 on br1, SUBNETS[1]): two paths between each pair of hosts.
Nothing is created in the default namespace, so no test packet can reach a
real interface. Names carry a random run id so parallel or leftover runs
never collide; everything is deleted in close(), and at interpreter exit as a
last resort.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

SUBNETS = ("10.77.1", "10.77.2")  # private /24s, one per LAN; only ever configured inside our namespaces
SUBNET = SUBNETS[0]

_live_networks: set[Network] = set()


def netns_unavailable_reason() -> str | None:
    """Why multi-host tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    return None


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


def _in_ns(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", "netns", "exec", ns, *argv], check=check)


class Proc:
    """A process spawned in a host; stdout JSON lines are collected as events."""

    def __init__(self, popen: subprocess.Popen[str], label: str, log_dir: Path) -> None:
        self.popen = popen
        self.label = label
        self.stdout_log = log_dir / f"{label}.stdout"
        self.stderr_log = log_dir / f"{label}.stderr"
        self.events: list[dict[str, Any]] = []  # each with "_t": time.monotonic() on arrival
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"read-{label}")
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self) -> None:
        assert self.popen.stdout is not None
        with open(self.stdout_log, "a") as log:
            for line in self.popen.stdout:
                log.write(line)
                log.flush()
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    event["_t"] = time.monotonic()
                    with self._cond:
                        self.events.append(event)
                        self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def send(self, obj: Any) -> None:
        """Write one JSON line to the process's stdin (spawn with stdin=True)."""
        assert self.popen.stdin is not None, "spawn(..., stdin=True) to send"
        self.popen.stdin.write(json.dumps(obj) + "\n")
        self.popen.stdin.flush()

    def mark(self) -> int:
        """A position in the event stream, for wait_for(after=...)."""
        with self._cond:
            return len(self.events)

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float, after: int = 0
    ) -> dict[str, Any]:
        """The first event (from position `after`) matching `predicate`; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            index = after
            while True:
                while index < len(self.events):
                    if predicate(self.events[index]):
                        return self.events[index]
                    index += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{self.label}: no matching event within {timeout:.1f}s;"
                                         f" events: {[self._brief(e) for e in self.events]}")
                if not self._reader.is_alive() and index >= len(self.events):
                    raise AssertionError(f"{self.label} exited (rc={self.popen.poll()}) before a matching event")
                self._cond.wait(min(remaining, 0.2))

    def wait_event(self, kind: str, timeout: float, after: int = 0, **fields: Any) -> dict[str, Any]:
        """wait_for an event of `kind` whose top-level fields equal `fields`."""
        return self.wait_for(lambda e: e.get("event") == kind and all(e.get(k) == v for k, v in fields.items()),
                             timeout, after)

    def kill9(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)

    def terminate(self, timeout: float = 10) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self.popen.wait(timeout=10)

    def logs(self, tail: int = 40) -> str:
        parts = []
        for path in (self.stdout_log, self.stderr_log):
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                parts.append(f"--- {path.name} (last {len(lines)} lines)\n" + "\n".join(lines))
        return "\n".join(parts)

    @staticmethod
    def _brief(event: dict[str, Any]) -> str:
        return f"{event.get('event')}:{event.get('node_id')}"


class Host:
    def __init__(self, network: Network, index: int) -> None:
        self.network = network
        self.index = index
        self.name = f"h{index}"
        self.ns = f"sw{network.run_id}-h{index}"
        self.ips = [f"{subnet}.{index + 1}" for subnet in SUBNETS[:network.lans]]  # one per LAN, eth<lan>
        self.ip = self.ips[0]
        self.veth = f"vh{index}"  # bridge-side end on LAN 0, lives in the bridge namespace
        self.procs: list[Proc] = []

    def veth_on(self, lan: int) -> str:
        return self.veth if lan == 0 else f"{self.veth}l{lan}"

    def _create(self) -> None:
        br = self.network.bridge_ns
        _run(["ip", "netns", "add", self.ns])
        _in_ns(self.ns, "ip", "link", "set", "lo", "up")
        _in_ns(self.ns, "ip", "link", "set", "lo", "multicast", "on")
        for lan, ip in enumerate(self.ips):
            veth, eth = self.veth_on(lan), f"eth{lan}"
            _in_ns(br, "ip", "link", "add", veth, "type", "veth", "peer", "name", eth, "netns", self.ns)
            _in_ns(br, "ip", "link", "set", veth, "master", f"br{lan}")
            _in_ns(br, "ip", "link", "set", veth, "up")
            for argv in (
                ["ip", "addr", "add", f"{ip}/24", "dev", eth],
                ["ip", "link", "set", eth, "multicast", "on"],
                ["ip", "link", "set", eth, "up"],
            ):
                _in_ns(self.ns, *argv)
        _in_ns(self.ns, "ip", "route", "add", "224.0.0.0/4", "dev", "eth0")

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a short command inside this host."""
        return _in_ns(self.ns, *argv, check=check)

    def spawn(self, argv: list[str], env: dict[str, str] | None = None, label: str | None = None,
              cwd: str | os.PathLike[str] | None = None, stdin: bool = False) -> Proc:
        """Start `argv` inside this host; stdout/stderr go to log files in the network's log dir."""
        label = label or f"{self.name}-{len(self.procs)}"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        stderr = open(self.network.log_dir / f"{label}.stderr", "w")
        popen = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *argv],  # ip execs argv: popen.pid is the process itself
            stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            env=full_env, text=True, start_new_session=True, cwd=cwd,
        )
        stderr.close()
        proc = Proc(popen, label, self.network.log_dir)
        self.procs.append(proc)
        return proc

    def link_down(self, lan: int = 0) -> None:
        """Cut this host off a LAN's bridge (like pulling its cable: its own interface stays up)."""
        _in_ns(self.network.bridge_ns, "ip", "link", "set", self.veth_on(lan), "down")

    def link_up(self, lan: int = 0) -> None:
        _in_ns(self.network.bridge_ns, "ip", "link", "set", self.veth_on(lan), "up")


class Network:
    """A private LAN (or `lans` of them): one bridge namespace plus host namespaces added on demand."""

    def __init__(self, log_dir: str | os.PathLike[str], lans: int = 1) -> None:
        reason = netns_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        if not 1 <= lans <= len(SUBNETS):
            raise ValueError(f"1 to {len(SUBNETS)} LANs")
        self.lans = lans
        self.run_id = secrets.token_hex(3)
        self.bridge_ns = f"sw{self.run_id}-br"
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.hosts: list[Host] = []
        self._namespaces: list[str] = []
        _live_networks.add(self)
        try:
            _run(["ip", "netns", "add", self.bridge_ns])
            self._namespaces.append(self.bridge_ns)
            for lan in range(lans):
                _in_ns(self.bridge_ns, "ip", "link", "add", f"br{lan}", "type", "bridge")
                # Snooping would drop multicast until a querier appears; we have none.
                _in_ns(self.bridge_ns, "ip", "link", "set", f"br{lan}", "type", "bridge", "mcast_snooping", "0")
                _in_ns(self.bridge_ns, "ip", "link", "set", f"br{lan}", "up")
        except BaseException:
            self.close()
            raise

    def add_host(self) -> Host:
        host = Host(self, len(self.hosts) + 1)
        if len(self.hosts) >= 250:
            raise ValueError("at most 250 hosts per network")
        self._namespaces.append(host.ns)
        self.hosts.append(host)
        host._create()
        return host

    def add_hosts(self, n: int) -> list[Host]:
        return [self.add_host() for _ in range(n)]

    def logs(self) -> str:
        return "\n".join(f"=== {p.label} (pid {p.pid}, rc {p.popen.poll()})\n{p.logs()}"
                         for h in self.hosts for p in h.procs)

    def close(self) -> None:
        """Kill every process we spawned, then delete every namespace we created."""
        for host in self.hosts:
            for proc in host.procs:
                try:
                    if proc.popen.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.popen.wait(timeout=10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
                for stream in (proc.popen.stdout, proc.popen.stdin):
                    if stream:
                        try:
                            stream.close()
                        except OSError:
                            pass
        for ns in reversed(self._namespaces):
            # Anything still inside (grandchildren) would keep the namespace alive.
            pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run(["ip", "netns", "del", ns], check=False)
        self._namespaces.clear()
        _live_networks.discard(self)


@atexit.register
def _close_leftover_networks() -> None:
    for network in list(_live_networks):
        network.close()
