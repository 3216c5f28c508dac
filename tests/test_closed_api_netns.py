"""A swarm with a secret closes its API too (issue 33): a stranger host without the key gets 401.

One node with a swarm secret and no --api-key, on a host of its own; a stranger host beside it.
Every route the node's app has (listed from its router) answers the stranger 401 in the error
shape of the API called, with no key or a wrong one; /health answers with its public minimum only. The key
`swarm-node --print-api-key` prints opens everything, and a client on the node's own machine
needs none.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from netns import netns_unavailable_reason
from netns_client import in_netns
from swarm_cluster import API_PORT, serving_swarm

pytestmark = [pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason())),
              pytest.mark.timeout(300)]

SECRET = "a closed swarm's secret, long enough: 3b7e0c5d"
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}


class _Anything:
    """A stand-in for the service the app is built around: the routes are all this test reads."""

    def __getattr__(self, name: str) -> "_Anything":
        return _Anything()

    def __call__(self, *args, **kwargs) -> "_Anything":
        return _Anything()

    def __iter__(self):
        return iter(())


def app_routes() -> list[tuple[str, str]]:
    """(method, path) of every route the node's API serves, from its router (patterns filled in)."""
    from swarm.api.app import make_app
    app = make_app(_Anything(), _Anything(), _Anything(), "m", _Anything())
    routes = set()
    for route in app.router.routes():
        path = re.sub(r"\{[^}]*\}", "m", route.resource.canonical)
        routes.add((route.method, path))
    assert ("POST", "/v1/chat/completions") in routes and ("GET", "/v1/topology") in routes, routes
    return sorted(routes)


def request(url: str, method: str, key: str | None = None) -> tuple[int, dict, dict]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(CHAT).encode() if method == "POST" else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            body = r.read()
            status, hdrs = r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        body, status, hdrs = e.read(), e.code, dict(e.headers)
    try:
        parsed = json.loads(body) if body and method != "HEAD" else {}
    except ValueError:
        parsed = {"raw": body[:200].decode(errors="replace")}
    return status, parsed, hdrs


def printed_api_key(state_dir: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "swarm.cli", "--print-api-key", "--state-dir", str(state_dir)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(scope="module")
def closed_node(tmp_path_factory, tiny_models):
    root = tmp_path_factory.mktemp("closed-api")
    with serving_swarm(root, 1, ["--model", str(tiny_models["llama"])], stages=1, timeout=150, strangers=1,
                       secret=SECRET) as cluster:
        yield cluster, cluster.strangers[0]


def test_a_stranger_without_the_key_gets_401_on_every_route(closed_node):
    cluster, stranger = closed_node
    node = cluster.nodes[0]
    base = f"http://{node.host.ip}:{API_PORT}"
    routes = app_routes()
    print("routes:", routes)
    for method, path in routes:
        for key in (None, "sk-swarm-not-the-key"):
            status, body, headers = in_netns(stranger.ns, request, base + path, method, key)
            if path == "/health":  # open, but only whether the node serves
                assert status == 200, (method, body)
                if method != "HEAD":
                    assert body["status"] == "ok" and body["security"]["api_key"] is True, body
                    assert "node_id" not in body and "plan_id" not in body and "peer_connections" not in body
                continue
            assert status == 401, (method, path, key, status, body)
            assert headers.get("WWW-Authenticate", "").startswith("Bearer"), headers
            if method != "HEAD":  # in the shape of the API called (OpenAI's, Anthropic's, Ollama's)
                assert body.get("error"), body
                if isinstance(body["error"], dict) and "code" in body["error"]:
                    assert body["error"]["code"] == "invalid_api_key", body
                assert "10.77." not in json.dumps(body) and node.node_id not in json.dumps(body)


def test_the_printed_key_opens_the_api_and_the_node_s_own_machine_needs_none(closed_node):
    cluster, stranger = closed_node
    node = cluster.nodes[0]
    base = f"http://{node.host.ip}:{API_PORT}"
    key = printed_api_key(cluster.root / "state0")
    assert key.startswith("sk-swarm-") and SECRET not in key
    status, top, _ = in_netns(stranger.ns, request, base + "/v1/topology", "GET", key)
    assert status == 200 and top["plan"]["stages"], top
    status, reply, _ = in_netns(stranger.ns, request, base + "/v1/chat/completions", "POST", key)
    assert status == 200 and reply["choices"][0]["message"]["content"], reply
    status, health, _ = in_netns(stranger.ns, request, base + "/health", "GET", key)
    assert status == 200 and health["node_id"] == top["node_id"], health
    # On the node's own host, by its LAN address and by loopback: served without a key.
    for url in (base, f"http://127.0.0.1:{API_PORT}"):
        status, top, _ = in_netns(node.host.ns, request, url + "/v1/topology", "GET")
        assert status == 200 and top["node_id"] == health["node_id"], (url, top)
