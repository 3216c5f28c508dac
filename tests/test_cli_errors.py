"""A missing or broken model gives one clear error line and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from swarm.bench.cluster import free_port, get_json


def run_node(*args: str, tmp_path) -> subprocess.CompletedProcess:  # a later --state-dir wins
    return subprocess.run([sys.executable, "-m", "swarm.cli", "--api-port", "0", "--state-dir", str(tmp_path / "s"),
                           *args], capture_output=True, text=True, timeout=60)


def broken_dirs(tmp_path):
    no_config = tmp_path / "empty"
    no_config.mkdir()
    bad_json = tmp_path / "badjson"
    bad_json.mkdir()
    (bad_json / "config.json").write_text("{nope")
    no_weights = tmp_path / "noweights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text('{"num_hidden_layers": 2, "model_type": "llama"}')
    (no_weights / "tokenizer.json").write_text("{}")
    bad_gguf = tmp_path / "bad.gguf"
    bad_gguf.write_bytes(b"GGUF" + b"\x00" * 100)
    not_model = tmp_path / "notes.txt"
    not_model.write_text("hi")
    return [tmp_path / "does-not-exist", no_config, bad_json, no_weights, bad_gguf, not_model]


def test_broken_models_exit_2_with_one_line(tmp_path):
    paths = broken_dirs(tmp_path)
    with ThreadPoolExecutor(3) as pool:  # each start is mostly imports: three at a time halve the wait
        runs = list(pool.map(lambda ip: run_node("--model", str(ip[1]), "--state-dir", str(tmp_path / f"s{ip[0]}"),
                                                 tmp_path=tmp_path), enumerate(paths)))
    for path, r in zip(paths, runs):
        assert r.returncode == 2, (path, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("swarm-node: error:"), (path, r.stderr)
        assert "Traceback" not in r.stderr


def test_a_model_that_cannot_be_split_is_refused_at_start_by_name(tmp_path):
    from model_zoo import build_random_model
    from swarm.engine.families import REFUSED
    for family in ("gemma3n", "hunyuan"):
        model = build_random_model(tmp_path / family, family)
        r = run_node("--model", str(model), "--no-mdns", tmp_path=tmp_path)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip() == f"swarm-node: error: {family}: cannot be split into contiguous layer ranges: " \
                                   f"{REFUSED[family]}"


def test_a_model_this_machine_does_not_hold_is_looked_for_on_peers_and_said_so(tmp_path):
    """A repo id not in the local Hugging Face cache (or any id no local path names) is a model to
    fetch from the swarm: with no peer serving it, the node waits and says so, once, and in /health."""
    api = free_port()
    log = tmp_path / "node.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "swarm.cli", "--api-host", "127.0.0.1", "--api-port", str(api), "--peer-host",
             "127.0.0.1", "--peer-port", str(free_port()), "--no-mdns", "--state-dir", str(tmp_path / "s"),
             "--cache-dir", str(tmp_path / "cache"), "--model", "mlx-community/Not-Cached-4bit"],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "empty-hub"), "HF_HUB_OFFLINE": "1"})
    try:
        hub = tmp_path / "empty-hub"
        waiting = (f"mlx-community/Not-Cached-4bit is no local path and not in the local Hugging "
                   f"Face cache ({hub}); no peer of swarm 'default' holds "
                   f"'mlx-community/Not-Cached-4bit': waiting for one")
        deadline, body = time.monotonic() + 60, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, body = get_json(f"http://127.0.0.1:{api}/health")
                if status == 503 and body.get("status") == waiting:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()
        assert body["status"] == waiting, body
        time.sleep(3)  # it keeps looking, and does not repeat itself
        [line] = [line for line in log.read_text().splitlines() if "no peer" in line]
        assert line.endswith(f"{body['status']} (peers in view: none)"), log.read_text()
    finally:
        proc.terminate()
        proc.wait(10)


def test_help_explains_the_flags():
    r = subprocess.run([sys.executable, "-m", "swarm.cli", "--help"], capture_output=True, text=True)
    for flag in ["--model", "--api-host", "--api-port", "--peer-port", "--state-dir", "--node-id", "--log-level"]:
        assert flag in r.stdout


@pytest.mark.parametrize("flag,value", [("--temperature", "3"), ("--temperature", "warm"), ("--top-p", "0"),
                                        ("--top-k", "-1")])
def test_bad_sampling_defaults_are_refused_by_flag(tmp_path, flag, value):
    r = run_node(flag, value, "--no-mdns", tmp_path=tmp_path)
    assert r.returncode == 2 and flag in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_secret_that_begins_with_a_dash_is_refused_with_how_to_give_it(tmp_path):
    r = run_node("--secret", "-Zm9vYmFy", "--no-mdns", tmp_path=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--secret" in r.stderr and "--flag=VALUE" in r.stderr, r.stderr


def test_model_and_join_together_are_refused_in_one_line(tmp_path):
    r = run_node("--model", "somewhere", "--join", "--no-mdns", tmp_path=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--model or --join" in r.stderr, r.stderr
