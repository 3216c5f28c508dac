"""A node started under a low descriptor limit (`ulimit -n`): it serves, or says why in one line (issue 33).

mlx-lm's import sets the limit to (2048, 4096), which raised ValueError under a hard limit
below 4,096 and killed the node with a traceback, and otherwise left the node with 2,048
descriptors whatever the system allowed. Real node processes on loopback, their limit set
before they start, as a shell's `ulimit -n` does.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from helpers import http_json
from node_process import NodeProcess, start_node

pytestmark = pytest.mark.timeout(300)


def start_with_limit(tmp_path: Path, model: Path, soft: int, hard: int) -> NodeProcess:
    return start_node(tmp_path, "--speed", "0.002", "--model", str(model), descriptors=(soft, hard))


def open_files_limit(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open files line")


@pytest.mark.parametrize("soft,hard", [(1024, 1024), (1024, None)])
def test_a_node_under_a_low_limit_serves_with_all_the_system_allows(tmp_path, tiny_models, soft, hard):
    # None: this process's own hard limit (4,096 once mlx-lm was imported here), above the soft one.
    if hard is None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard <= soft:
            pytest.skip(f"this process's hard limit is {hard}")
    node = start_with_limit(tmp_path, tiny_models["llama"], soft, hard)
    try:
        node.wait_ready(150)
        # As high as the hard limit allows, and the hard limit never lowered (mlx-lm's import would).
        assert open_files_limit(node.proc.pid) == (hard, hard)
        body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}
        status, reply = http_json(node.url + "/v1/chat/completions", body)
        assert status == 200 and reply["choices"][0]["message"]["content"]
    finally:
        node.stop()
    assert "Traceback" not in node.log.read_text()


def test_a_limit_too_low_to_run_is_one_clear_line(tmp_path, tiny_models):
    node = start_with_limit(tmp_path, tiny_models["llama"], 64, 64)
    try:
        code = node.proc.wait(120)
    finally:
        node.stop()
    text = node.log.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 2, text
    assert "Traceback" not in text, text
    errors = [line for line in lines if line.startswith("swarm-node: error:")]
    assert len(errors) == 1 and "ulimit -n" in errors[0] and "64" in errors[0], text
