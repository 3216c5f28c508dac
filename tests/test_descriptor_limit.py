"""A node started under a low descriptor limit (`ulimit -n`): it serves, or says why in one line (issue 33).

mlx-lm's import sets the limit to (2048, 4096), which raised ValueError under a hard limit
below 4,096 and killed the node with a traceback, and otherwise left the node with 2,048
descriptors whatever the system allowed. Real node processes on loopback, their limit set
before they start, as a shell's `ulimit -n` does.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from node_process import free_port, get_json

pytestmark = pytest.mark.timeout(300)


def start_with_limit(tmp_path: Path, model: Path, soft: int, hard: int) -> tuple[subprocess.Popen, str, Path]:
    api, peer = free_port(), free_port()
    log = tmp_path / f"node-{api}.log"
    argv = [sys.executable, "-m", "swarm.cli", "--api-host", "127.0.0.1", "--api-port", str(api),
            "--peer-host", "127.0.0.1", "--peer-port", str(peer), "--no-mdns", "--speed", "0.002",
            "--state-dir", str(tmp_path / f"state-{api}"), "--model", str(model)]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out, preexec_fn=limit)
    return proc, f"http://127.0.0.1:{api}", log


def open_files_limit(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open files line")


def wait_serving(proc: subprocess.Popen, url: str, log: Path, timeout: float = 150) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            status, body = get_json(url + "/health")
            if status == 200:
                return body
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"not serving after {timeout}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("soft,hard", [(1024, 1024), (1024, None)])
def test_a_node_under_a_low_limit_serves_with_all_the_system_allows(tmp_path, tiny_models, soft, hard):
    # None: this process's own hard limit (4,096 once mlx-lm was imported here), above the soft one.
    if hard is None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard <= soft:
            pytest.skip(f"this process's hard limit is {hard}")
    proc, url, log = start_with_limit(tmp_path, tiny_models["llama"], soft, hard)
    try:
        wait_serving(proc, url, log)
        # As high as the hard limit allows, and the hard limit never lowered (mlx-lm's import would).
        assert open_files_limit(proc.pid) == (hard, hard)
        body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}
        import json
        import urllib.request
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.status == 200 and json.loads(r.read())["choices"][0]["message"]["content"]
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text()


def test_a_limit_too_low_to_run_is_one_clear_line(tmp_path, tiny_models):
    proc, _, log = start_with_limit(tmp_path, tiny_models["llama"], 64, 64)
    try:
        code = proc.wait(120)
    finally:
        stop(proc)
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 2, text
    assert "Traceback" not in text, text
    errors = [line for line in lines if line.startswith("swarm-node: error:")]
    assert len(errors) == 1 and "ulimit -n" in errors[0] and "64" in errors[0], text
