"""Start a real `swarm-node` process on loopback for a test, and always stop it."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from swarm.bench.cluster import free_port, get_json


class NodeProcess:
    def __init__(self, proc: subprocess.Popen, api_port: int, peer_port: int, log: Path):
        self.proc, self.api_port, self.peer_port, self.log = proc, api_port, peer_port, log
        self.url = f"http://127.0.0.1:{api_port}"

    def health(self) -> tuple[int, dict]:
        return get_json(self.url + "/health")

    def wait_ready(self, timeout: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                status, body = self.health()
                if status == 200:
                    return body
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"node not ready after {timeout}s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_node(tmp_path: Path, *extra: str, env: dict | None = None,
               descriptors: tuple[int, int] | None = None) -> NodeProcess:
    """A node started, not waited for (see running_node); the caller stops it. `descriptors`: the (soft,
    hard) limit of open files it starts under, as a shell's `ulimit -n` sets it."""
    api_port, peer_port = free_port(), free_port()
    log = tmp_path / f"node-{api_port}.log"
    # A lone node on loopback: no mDNS, which would multicast on the machine's real interfaces.
    argv = [sys.executable, "-m", "swarm.cli", "--api-host", "127.0.0.1", "--api-port", str(api_port),
            "--peer-host", "127.0.0.1", "--peer-port", str(peer_port), "--no-mdns",
            "--state-dir", str(tmp_path / f"state-{api_port}"), *extra]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, descriptors)

    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                preexec_fn=limit if descriptors else None)
    return NodeProcess(proc, api_port, peer_port, log)


@contextmanager
def running_node(tmp_path: Path, *extra: str, env: dict | None = None):
    node = start_node(tmp_path, *extra, env=env)
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()
