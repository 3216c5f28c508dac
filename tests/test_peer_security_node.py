"""A node says whether its swarm is open, and where its secret came from (never the secret): real processes."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest
from node_process import running_node
from swarm.bench.cluster import get_json

from swarm.transport import sodium_gcm

pytestmark = pytest.mark.timeout(300)


def test_new_secret_writes_a_private_file_prints_how_to_use_it_and_never_overwrites(tmp_path):
    state = tmp_path / "state"
    r = subprocess.run([sys.executable, "-m", "swarm.cli", "--new-secret", "--state-dir", str(state)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    secret = (state / "secret").read_text().strip()
    assert len(secret) >= 40 and stat.S_IMODE((state / "secret").stat().st_mode) == 0o600
    for how in (f"--secret {secret}", f"SWARM_SECRET={secret}", "secret", str(state / "secret")):
        assert how in r.stdout, r.stdout
    again = subprocess.run([sys.executable, "-m", "swarm.cli", "--new-secret", "--state-dir", str(state)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already holds a secret" in again.stderr
    assert (state / "secret").read_text().strip() == secret


def test_an_empty_secret_file_is_one_error_line_not_an_open_swarm(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "secret").write_text("\n")
    r = subprocess.run([sys.executable, "-m", "swarm.cli", "--state-dir", str(state), "--no-mdns", "--api-port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().startswith("swarm-node: error:") and "empty" in r.stderr


def test_an_open_node_warns_and_says_so_in_health_and_topology(tmp_path, llama):
    with running_node(tmp_path, "--model", str(llama), "--speed", "0.002",
                      env={"SWARM_SECRET": ""}) as node:
        for path in ("/health", "/v1/topology"):
            status, body = get_json(node.url + path)
            assert status == 200 and body["security"]["peers"] == "open", body.get("security")
        log = node.log.read_text()
        assert "WARNING" in log and "OPEN SWARM" in log


def test_the_flag_wins_over_the_environment_which_wins_over_the_file(tmp_path, llama):
    state = tmp_path / "shared-state"
    state.mkdir()
    (state / "secret").write_text("from the file, long enough\n")
    model = ["--model", str(llama), "--speed", "0.002"]
    cases = [((), {}, str(state / "secret")),
             ((), {"SWARM_SECRET": "from the environment, long enough"}, "$SWARM_SECRET"),
             (("--secret", "from the flag, long enough"), {"SWARM_SECRET": "from the environment"}, "--secret")]
    for i, (flag, env, source) in enumerate(cases):
        (tmp_path / f"n{i}").mkdir()
        with running_node(tmp_path / f"n{i}", *model, *flag, "--state-dir", str(state), env=env) as node:
            status, health = get_json(node.url + "/health")
            expected = {"peers": "secret", "secret_from": source, "api_key": True}  # derived from the secret
            assert health["security"] == expected, health["security"]
            status, topology = get_json(node.url + "/v1/topology")
            assert topology["security"]["peers"] == "secret"
            log = node.log.read_text()
            assert "OPEN SWARM" not in log and f"swarm secret from {source}" in log
            assert "a hop's frames by libsodium" in log or not sodium_gcm.IN_USE  # the node's own process, too
            assert "long enough" not in log  # the secret itself is never logged
