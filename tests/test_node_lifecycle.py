"""A node's life as a user meets it in a terminal: real `swarm-node` processes, signals and sockets.

Taken or impossible ports are one line naming the flag (exit 2, never an abort or a traceback);
the node says what it is doing while it starts and one "ready: URL" line; Ctrl-C stops taking
requests and lets the taken ones finish, a second Ctrl-C stops now; Ctrl-C while starting
leaves quietly; a client that goes away frees its request; a swarm too small says so in the log.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from helpers import openai_client
from node_process import running_node, start_node
from swarm.bench.cluster import free_port
from swarm.engine.blas import find_optimized_blas

NO_EOS = {"2": -100}  # the tiny models' EOS never comes: generations run to max_tokens


def node_argv(tmp_path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "swarm.cli", "--no-mdns", "--api-host", "127.0.0.1", "--peer-host", "127.0.0.1",
            "--state-dir", str(tmp_path / "second-state"), *extra]


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("swarm-node: error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def wait_for_log(node, pattern: str, timeout: float = 60.0) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if m := re.search(pattern, node.log.read_text()):
            return m
        assert node.proc.poll() is None or re.search(pattern, node.log.read_text()), node.log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no {pattern!r} in the log:\n{node.log.read_text()}")


def test_ports_another_node_holds_are_one_line_naming_the_flag(tmp_path, llama):
    with running_node(tmp_path, "--model", str(llama), "--speed", "0.002") as first:
        for flag, ports in (("--api-port", [str(first.api_port), str(free_port())]),
                            ("--peer-port", [str(free_port()), str(first.peer_port)])):
            argv = node_argv(tmp_path, "--model", str(llama), "--api-port", ports[0], "--peer-port", ports[1])
            r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            line = one_error_line(r)
            taken = first.api_port if flag == "--api-port" else first.peer_port
            assert line.startswith(f"swarm-node: error: {flag} {taken}: ") and "already in use" in line, line
            assert "another swarm-node" in line, line
        assert first.health()[0] == 200, "the first node serves on"


@pytest.mark.parametrize("flag,value", [("--api-port", "80000"), ("--peer-port", "-1"), ("--api-port", "http"),
                                        ("--peer-port", "65536")])
def test_ports_out_of_range_are_one_line_naming_the_flag(tmp_path, flag, value):
    r = subprocess.run(node_argv(tmp_path, flag, value), capture_output=True, text=True, timeout=60)
    line = one_error_line(r)
    assert f"argument {flag}: expected a port from 1 to 65535" in line and repr(value) in line, line


def test_start_tells_its_progress_and_one_ready_line(tmp_path, default_model):
    # A fresh cache: the built-in GGUF model is converted, which takes a while and says so.
    node = start_node(tmp_path, "--cache-dir", str(tmp_path / "cache"), "--speed", "0.002")
    try:
        ready = wait_for_log(node, r"ready: (http://\S+/v1)\n", timeout=300)
        assert ready.group(1) == f"http://127.0.0.1:{node.api_port}/v1"
        log = node.log.read_text()
        steps = ["converting SmolLM2-135M-Instruct.Q4_1.gguf", "converting: 50%", "converted in",
                 "loading layers [0, 30)", "ready: "]
        at = [log.find(s) for s in steps]
        assert -1 not in at and at == sorted(at), (steps, at, log)
        client = openai.OpenAI(base_url=ready.group(1), api_key="none", max_retries=0, timeout=120)
        client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=2,
                                       messages=[{"role": "user", "content": "Hi"}])
        assert node.log.read_text().count("ready: ") == 1
    finally:
        node.stop()


def stream_until(node, chunks: int, max_tokens: int):
    client = openai_client(node.url)
    stream = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "go on"}],
                                            max_tokens=max_tokens, temperature=0.8, seed=3, logit_bias=NO_EOS,
                                            stream=True, stream_options={"include_usage": True})
    it = iter(stream)
    seen = [next(it) for _ in range(chunks)]
    return client, it, seen


def test_ctrl_c_finishes_the_taken_requests_and_takes_no_new_ones(tmp_path, llama):
    node = start_node(tmp_path, "--model", str(llama), "--speed", "0.002")
    try:
        node.wait_ready()
        client, rest, seen = stream_until(node, 3, max_tokens=300)
        node.proc.send_signal(signal.SIGINT)
        wait_for_log(node, r"stopping: no new requests; 1 request finishing \(Ctrl-C again to stop now\)")
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert refused.value.status_code == 503 and "shutting down" in refused.value.message
        assert node.health()[0] == 200, "health still answers while the taken requests finish"
        chunks = seen + list(rest)
        assert chunks[-1].usage.completion_tokens == 300, "the stream taken before Ctrl-C ran to its end"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert node.proc.wait(30) == 0
        assert "Traceback" not in node.log.read_text()
    finally:
        node.stop()


def test_a_second_ctrl_c_stops_now(tmp_path, llama):
    node = start_node(tmp_path, "--model", str(llama), "--speed", "0.002")
    try:
        node.wait_ready()
        _, rest, _ = stream_until(node, 3, max_tokens=4000)
        node.proc.send_signal(signal.SIGINT)
        wait_for_log(node, "1 request finishing")
        node.proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        assert node.proc.wait(30) in (0, 130)
        assert time.monotonic() - t0 < 15
        log = node.log.read_text()
        assert "stopping now: 1 request cut off" in log and "Traceback" not in log, log
        with pytest.raises(Exception):  # the stream was cut, not finished
            for chunk in rest:
                assert not (chunk.choices and chunk.choices[0].finish_reason), "the stream must not finish"
    finally:
        node.stop()


@pytest.mark.parametrize("after", [0.0, 0.5, 1.5, 3.0, 5.0])
def test_ctrl_c_while_starting_leaves_quietly(tmp_path, llama, after):
    node = start_node(tmp_path, "--model", str(llama))  # no --speed: the start measures it, a slow step
    # The clock starts once our code runs: a Ctrl-C while Python itself starts (0.5 s on a loaded machine) is
    # Python's "Fatal Python error: init_import_site". The re-exec that preloads BLAS holds it (blas.py).
    if find_optimized_blas() is not None:
        environ = Path(f"/proc/{node.proc.pid}/environ")
        deadline = time.monotonic() + 30
        while b"SWARM_BLAS_ACTIVE=" not in environ.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(after)
    node.proc.send_signal(signal.SIGINT)
    try:
        code = node.proc.wait(30)
    finally:
        node.stop()
    log = node.log.read_text()
    assert code in (0, 130), (code, log)  # 134 is an abort
    assert "Traceback" not in log and "terminate called" not in log, log


def health_when(node, ok, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = node.health()[1]
        if ok(health):
            return health
        time.sleep(0.1)
    return health


def test_a_client_gone_frees_its_non_streaming_request(tmp_path, llama):
    request = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 2000, "temperature": 0.8,
               "seed": 5, "logit_bias": NO_EOS}
    with running_node(tmp_path, "--model", str(llama), "--speed", "0.002") as node:
        client = openai_client(node.url, timeout=300)
        whole = client.chat.completions.create(model="llama", **request).usage.completion_tokens
        before = node.health()[1]["total_tokens"]
        body = json.dumps(request).encode()
        with socket.create_connection(("127.0.0.1", node.api_port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            health = health_when(node, lambda h: h["total_tokens"] - before >= 20)
            assert health["active_requests"] == 1, health
        health = health_when(node, lambda h: h["active_requests"] == 0 and h["cached_requests"] == 0)
        assert health["active_requests"] == 0 and health["cached_requests"] == 0, health
        time.sleep(1.0)
        after = node.health()[1]["total_tokens"]
        time.sleep(1.0)
        assert node.health()[1]["total_tokens"] == after, "the generation stopped with its client"
        assert after - before < whole / 2, f"{after - before} of the {whole} tokens the same request makes whole"


def test_the_log_says_when_the_swarm_cannot_hold_the_model(tmp_path, llama):
    node = start_node(tmp_path, "--model", str(llama), "--speed", "0.002", "--memory-limit", "100K")
    try:
        line = wait_for_log(node, r"WARNING \S+: the swarm cannot hold the model: .*\n").group(0)
        assert "waiting for more nodes or memory" in line
        assert node.health()[0] == 503
        assert "ready: " not in node.log.read_text()
    finally:
        node.stop()


def test_the_ready_urls_follow_the_address_family_listened_on():
    """asyncio's servers take "::" as IPv6 only, "0.0.0.0" as IPv4 only, "" as both: the ready line names
    only addresses that answer (a host's own address on a network is in tests/test_ready_line_netns.py)."""
    from swarm.node.ports import reachable_urls
    v4, v6, both = reachable_urls("0.0.0.0", 8800), reachable_urls("::", 8800), reachable_urls("", 8800)
    assert "http://127.0.0.1:8800/v1" in v4 and not any("[" in u for u in v4), v4
    assert all("[" in u for u in v6) and v6[-1] == "http://[::1]:8800/v1", v6
    assert set(v4) <= set(both) and v4[-1] == "http://127.0.0.1:8800/v1"
    assert reachable_urls("10.1.2.3", 9) == ["http://10.1.2.3:9/v1"]
    assert reachable_urls("fd00::5", 9) == ["http://[fd00::5]:9/v1"]
