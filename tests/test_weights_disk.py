"""A node that fetches its model onto a disk too small for it says so, and goes on once there is room."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from node_process import running_node
from swarm.bench.cluster import free_port, get_json

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "small"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def health(port: int) -> tuple[int, dict]:
    try:
        return get_json(f"http://127.0.0.1:{port}/health")
    except OSError:
        return 0, {}


def test_not_enough_disk_is_said_and_retried_when_room_appears(tmp_path, llama, small_disk):
    fetcher_peer_port = free_port()
    with running_node(tmp_path, "--model", str(llama), "--speed", "0.002",
                      "--peer", f"127.0.0.1:{fetcher_peer_port}") as holder:
        api = free_port()
        log = tmp_path / "fetcher.log"
        argv = [sys.executable, "-m", "swarm.cli", "--model", "llama", "--api-host", "127.0.0.1",
                "--api-port", str(api), "--peer-host", "127.0.0.1", "--peer-port", str(fetcher_peer_port), "--no-mdns",
                "--peer", f"127.0.0.1:{holder.peer_port}", "--state-dir", str(tmp_path / "fetcher-state"),
                "--cache-dir", str(small_disk), "--speed", "0.002"]
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline, body = time.monotonic() + 60, {}
            while time.monotonic() < deadline and "GB free" not in body.get("status", ""):
                assert proc.poll() is None, log.read_text()
                _, body = health(api)
                time.sleep(0.3)
            print(body["status"])
            assert "more on" in body["status"] and body["fetch"]["state"] == "no_disk"
            subprocess.run(["mount", "-o", "remount,size=200m", str(small_disk)], check=True)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and health(api)[0] != 200:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.3)
            status, body = health(api)
            assert status == 200, body
            assert log.read_text().count("cannot fetch the model's small files yet") >= 1
        finally:
            proc.terminate()
            proc.wait(15)
