"""Web pages are strangers (api/web_guard.py, origins.py, hosts.py), against a real node on loopback.

A page of another site may POST to any address a browser reaches, with no preflight for text/plain
bodies and forms, and a page whose own name was re-pointed at this machine (DNS rebinding) reads
every answer. So every route of every face answers 403, in its API's error shape, to a request from a
foreign Origin or naming a foreign Host, before it reads a body or queues any work (the node's request
counter does not move); allowed origins get CORS answers, preflight included; clients that send no
Origin (curl, the SDKs) are unaffected. The browser itself is in test_web_pages_netns.py.
"""

from __future__ import annotations

import http.client
import json

import pytest

NODE_ARGS = ("--allowed-origins", "https://chat.example.org", "--allowed-hosts", "swarm-box.lan")

CHAT = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4}
# (method, path, body): every route of every face, with a body that would run the model where it can.
ROUTES = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4}),
    ("POST", "/v1/responses", {"input": "Hello", "max_output_tokens": 4}),
    ("GET", "/v1/responses/resp_0123", None),
    ("DELETE", "/v1/responses/resp_0123", None),
    ("POST", "/v1/messages", {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}),
    ("POST", "/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
    ("GET", "/v1/models", None),
    ("GET", "/v1/topology", None),
    ("GET", "/v1/topology/events", None),
    ("POST", "/api/chat", {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": False,
                           "options": {"num_predict": 4}}),
    ("POST", "/api/generate", {"model": "m", "prompt": "Hi", "stream": False, "options": {"num_predict": 4}}),
    ("GET", "/api/tags", None),
    ("POST", "/api/show", {"model": "m"}),
    ("GET", "/api/ps", None),
    ("GET", "/api/version", None),
]


def request(node, method: str, path: str, body=None, headers: dict | None = None,
            content_type: str = "text/plain") -> tuple[int, dict, dict]:
    """(status, headers, JSON body or {}), with exactly the headers given (Host too, when given)."""
    conn = http.client.HTTPConnection("127.0.0.1", node.api_port, timeout=60)
    headers = dict(headers or {})
    try:
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        data = json.dumps(body).encode() if body is not None else None
        for name, value in headers.items():
            conn.putheader(name, value)
        if data is not None:
            conn.putheader("Content-Type", content_type)
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        resp = conn.getresponse()
        got = {k.lower(): v for k, v in resp.getheaders()}
        if path.endswith("/events") and resp.status == 200:
            return resp.status, got, {"first": resp.readline().decode()}
        raw = resp.read()
        try:
            parsed = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            parsed = {"raw": raw.decode(errors="replace")}
        return resp.status, got, parsed
    finally:
        conn.close()


def model_id(node) -> str:
    return request(node, "GET", "/v1/models")[2]["data"][0]["id"]


def total_requests(node) -> int:
    status, _, body = request(node, "GET", "/health")
    assert status == 200, body
    return body["total_requests"]


def assert_refused_in_shape(path: str, status: int, body: dict) -> None:
    assert status == 403, (path, status, body)
    if path.startswith("/api/"):
        assert isinstance(body["error"], str) and body["error"]
    elif path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "permission_error", body
    else:
        assert body["error"]["type"] == "permission_error" and body["error"]["message"], body


@pytest.mark.parametrize("headers", [
    {"Origin": "http://evil.example"},
    {"Origin": "null"},
    {"Origin": "http://evil.example:8800"},
    {"Host": "evil.example:8800"},
    {"Host": "evil.example"},
    {"Sec-Fetch-Site": "cross-site"},
], ids=["foreign-origin", "null-origin", "foreign-origin-on-our-port", "rebinding-host", "rebinding-host-no-port",
        "cross-site-without-origin"])
def test_every_route_refuses_a_stranger_page_before_any_work(node, headers):
    before = total_requests(node)
    for method, path, body in ROUTES:
        status, _, answer = request(node, method, path, body, headers)
        assert_refused_in_shape(path, status, answer)
        assert "access-control-allow-origin" not in _
    assert total_requests(node) == before


def test_a_foreign_origin_is_refused_before_its_body_is_read(node):
    """A declared 1 MB body that never comes: the 403 comes at once, not after the body timeout."""
    conn = http.client.HTTPConnection("127.0.0.1", node.api_port, timeout=10)
    try:
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Origin", "http://evil.example")
        conn.putheader("Content-Type", "text/plain")
        conn.putheader("Content-Length", str(1 << 20))
        conn.endheaders(b"{")
        assert conn.getresponse().status == 403
    finally:
        conn.close()


def test_health_answers_a_stranger_only_whether_the_node_serves(node):
    for headers in ({"Origin": "http://evil.example"}, {"Host": "evil.example:8800"}):
        status, got, body = request(node, "GET", "/health", headers=headers)
        assert (status, body) == (200, {"status": "ok"})
        assert "access-control-allow-origin" not in got


@pytest.mark.parametrize("origin", ["http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]:8080",
                                    "https://localhost", "http://app.localhost:3000", "https://chat.example.org"])
def test_allowed_origins_chat_stream_and_read_the_topology_through_cors(node, origin):
    before = total_requests(node)
    status, headers, body = request(node, "POST", "/v1/chat/completions", CHAT, {"Origin": origin},
                                    content_type="application/json")
    assert status == 200, body
    assert headers["access-control-allow-origin"] == origin
    assert "origin" in headers["vary"].lower()
    assert body["choices"][0]["message"]["content"] is not None
    status, headers, body = request(node, "GET", "/v1/topology", headers={"Origin": origin})
    assert status == 200 and headers["access-control-allow-origin"] == origin and body["node_id"]
    status, headers, body = request(node, "GET", "/v1/topology/events", headers={"Origin": origin})
    assert status == 200 and headers["access-control-allow-origin"] == origin
    assert total_requests(node) == before + 1


def test_a_streamed_answer_carries_cors_headers_before_its_first_byte(node):
    origin = "http://localhost:5173"
    conn = http.client.HTTPConnection("127.0.0.1", node.api_port, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({**CHAT, "stream": True}),
                     {"Origin": origin, "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Access-Control-Allow-Origin") == origin
        assert b"data: [DONE]" in resp.read()
    finally:
        conn.close()


def test_the_nodes_own_api_origin_and_its_names_are_allowed(node):
    own = f"http://127.0.0.1:{node.api_port}"
    status, headers, _ = request(node, "GET", "/v1/models", headers={"Origin": own})
    assert status == 200 and headers["access-control-allow-origin"] == own
    for host in (f"localhost:{node.api_port}", f"127.0.0.1:{node.api_port}", f"[::1]:{node.api_port}",
                 "swarm-box.lan:8800", "SWARM-BOX.LAN"):
        status, _, body = request(node, "GET", "/v1/models", headers={"Host": host})
        assert status == 200, (host, body)


def test_the_address_the_node_says_it_listens_on_is_one_of_its_names(node):
    """The node logs `API on 0.0.0.0:8800`, and `curl 0.0.0.0:8800` reaches it: served, as are the IPv6
    any-address and IPv4-mapped forms of its addresses. No rebinding name can be one of them, and a page
    that sends them is still refused for its Origin."""
    for host in (f"0.0.0.0:{node.api_port}", f"[::]:{node.api_port}", f"[::ffff:127.0.0.1]:{node.api_port}"):
        status, _, body = request(node, "GET", "/v1/models", headers={"Host": host})
        assert status == 200, (host, body)
    status, headers, body = request(node, "POST", "/v1/chat/completions", CHAT,
                                    {"Host": f"0.0.0.0:{node.api_port}", "Origin": "http://evil.example"})
    assert status == 403 and "access-control-allow-origin" not in headers
    assert_refused_in_shape("/v1/chat/completions", status, body)


def test_a_preflight_of_an_allowed_origin_is_answered_and_a_foreign_one_refused(node):
    asked = {"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "content-type, authorization, x-api-key, anthropic-version, "
                                               "x-stainless-os, x-stainless-retry-count"}
    for path in ("/v1/chat/completions", "/v1/messages", "/api/chat", "/v1/responses/resp_1", "/v1/topology"):
        status, headers, _ = request(node, "OPTIONS", path, headers=asked)
        assert status == 204, (path, status)
        assert headers["access-control-allow-origin"] == "http://localhost:5173"
        assert {"POST", "DELETE"} <= {m.strip() for m in headers["access-control-allow-methods"].split(",")}
        allowed = {h.strip() for h in headers["access-control-allow-headers"].split(",")}
        assert {"content-type", "authorization", "x-api-key", "anthropic-version", "x-stainless-os",
                "x-stainless-retry-count"} <= allowed
        assert int(headers["access-control-max-age"]) > 0
    status, headers, body = request(node, "OPTIONS", "/v1/chat/completions",
                                    headers={**asked, "Origin": "http://evil.example"})
    assert status == 403 and "access-control-allow-origin" not in headers
    assert_refused_in_shape("/v1/chat/completions", status, body)


def test_clients_without_an_origin_are_unaffected(node):
    """curl's way: no Origin, no JSON content type (the README's line), Host as the node's address."""
    status, _, body = request(node, "POST", "/v1/chat/completions", CHAT,
                              {"Host": f"127.0.0.1:{node.api_port}"}, content_type="application/x-www-form-urlencoded")
    assert status == 200, body
    status, _, body = request(node, "POST", "/api/chat", {**ROUTES[10][2], "model": model_id(node)},
                              content_type="application/json")
    assert status == 200 and body["message"]["role"] == "assistant", body


def test_the_official_clients_send_no_origin_and_are_served(node):
    import anthropic
    import ollama
    import openai
    model = model_id(node)
    openai_reply = openai.OpenAI(base_url=node.url + "/v1", api_key="x").chat.completions.create(
        model=model, messages=CHAT["messages"], max_tokens=4)
    assert openai_reply.choices[0].message.content is not None
    anthropic_reply = anthropic.Anthropic(base_url=node.url, api_key="x").messages.create(
        model=model, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert anthropic_reply.content
    ollama_reply = ollama.Client(host=node.url).chat(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                     options={"num_predict": 4})
    assert ollama_reply.message.role == "assistant"


def test_a_closed_swarm_refuses_stranger_pages_before_its_key_and_serves_allowed_ones(tmp_path, llama):
    """With a secret a local client needs no key, and a browser on this machine is a local client: the
    page's origin is what tells the two apart."""
    from node_process import running_node
    with running_node(tmp_path, "--model", str(llama), env={"SWARM_SECRET": "a closed swarm, long enough 7f3a"}) as n:
        before = total_requests(n)
        for headers in ({"Origin": "http://evil.example"}, {"Host": "evil.example:8800"}):
            for method, path, body in ROUTES:
                status, got, answer = request(n, method, path, body, headers)
                assert_refused_in_shape(path, status, answer)
        asked = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type, authorization"}
        assert request(n, "OPTIONS", "/v1/chat/completions", headers=asked)[0] == 204
        status, headers, body = request(n, "POST", "/v1/chat/completions", CHAT, {"Origin": "http://localhost:3000"},
                                        content_type="application/json")
        assert status == 200 and headers["access-control-allow-origin"] == "http://localhost:3000", body
        assert total_requests(n) == before + 1
