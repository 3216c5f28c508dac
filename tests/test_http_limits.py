"""HTTP connections a stranger holds open, against a real node: unfinished headers and trickled
bodies end within the node's HTTP timeout (a 408 for the body), and one address gets at most so
many connections at once (a 429 past that), while everyone else is served."""

from __future__ import annotations

import json
import socket
import time

import pytest
from model_fixtures import tiny_models  # noqa: F401
from node_process import get_json, running_node

TIMEOUT_S = 5  # the node's --http-timeout
PER_ADDRESS = 64  # the node's default cap


@pytest.fixture(scope="module")
def node(tmp_path_factory, tiny_models):  # noqa: F811
    with running_node(tmp_path_factory.mktemp("http"), "--model", str(tiny_models["llama"]),
                      "--http-timeout", str(TIMEOUT_S)) as n:
        yield n


def closed_by_server(sock: socket.socket, within: float) -> tuple[bool, bytes]:
    """(whether the server closed the connection within `within` s, what it sent before)."""
    sock.settimeout(within)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        pass
    return True, got


def test_unfinished_headers_are_closed_within_the_http_timeout(node):
    with socket.create_connection(("127.0.0.1", node.api_port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Trickle: ")  # and never the end of the headers
        started = time.monotonic()
        closed, _ = closed_by_server(s, within=TIMEOUT_S * 12)  # generous: a loaded machine
        print(f"unfinished headers closed after {time.monotonic() - started:.1f} s")
        assert closed, "a connection with unfinished headers stayed open"
    with socket.create_connection(("127.0.0.1", node.api_port)) as s:  # an idle one too
        closed, _ = closed_by_server(s, within=TIMEOUT_S * 12)
        assert closed, "an idle connection stayed open"


def test_a_trickled_body_is_a_408(node):
    with socket.create_connection(("127.0.0.1", node.api_port)) as s:
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        s.settimeout(1.0)
        answer = b""
        for byte in body[:-1]:  # one byte a second: the whole body would take a minute
            s.sendall(bytes([byte]))
            try:
                answer = s.recv(4096)
            except TimeoutError:
                continue
            if answer:
                break
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code": "timeout"' in answer or b'"code":"timeout"' in answer


def test_one_address_gets_a_bounded_number_of_connections(node):
    held = [socket.create_connection(("127.0.0.1", node.api_port)) for _ in range(PER_ADDRESS)]
    try:
        extra = socket.create_connection(("127.0.0.1", node.api_port))
        closed, answer = closed_by_server(extra, within=TIMEOUT_S * 6)
        extra.close()
        assert closed and answer.startswith(b"HTTP/1.1 429"), answer[:200]
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 30
    while True:  # the held ones are gone: the address is served again
        try:
            status, health = get_json(node.url + "/health")
            if status == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the node did not serve the address again"
        time.sleep(0.1)
