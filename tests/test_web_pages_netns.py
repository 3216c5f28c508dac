"""Web pages against a real node, in a real browser: headless Chromium (browser.py) on a netns host
beside a node serving the tiny llama, and a page server on another port of that host.

- A page from another origin (http://<host>:9000) tries fetch POSTs (text/plain, application/json,
  with and without credentials, no-cors), reads the topology and submits a form: no inference runs
  (the node's request counter does not move) and the page reads nothing.
- A page from an allowed origin (http://localhost:9000, a loopback page) chats, streams and reads
  the topology through CORS.
- A page on a rebinding-style name (rebind.example, which the host's /etc/hosts points at the node's
  address, as a re-pointed DNS name would) fetches its own origin's /v1/topology and chat: refused.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
from browser import Browser, chromium_path
from netns import netns_unavailable_reason
from swarm_cluster import API_PORT, SwarmCluster

pytestmark = [
    pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason())),
    pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (scripts/install.sh --test "
                                                       "installs it)"),
]

PAGE_PORT = 9000
REBIND_NAME = "rebind.example"
CHAT = json.dumps({"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4})

FOREIGN_TRIES = """(async () => {
  const node = %(node)s, body = %(body)s, out = {};
  const post = (path, type, extra) => fetch(node + path, {method: "POST", headers: {"Content-Type": type}, body, ...extra});
  const tries = {
    text_plain: () => post("/v1/chat/completions", "text/plain", {}),
    text_plain_credentials: () => post("/v1/chat/completions", "text/plain", {credentials: "include"}),
    json: () => post("/v1/chat/completions", "application/json", {}),
    json_credentials: () => post("/v1/chat/completions", "application/json", {credentials: "include"}),
    no_cors: () => post("/v1/chat/completions", "text/plain", {mode: "no-cors"}),
    anthropic: () => post("/v1/messages", "text/plain", {}),
    ollama: () => post("/api/generate", "text/plain", {mode: "no-cors"}),
    responses: () => post("/v1/responses", "text/plain", {}),
    topology: () => fetch(node + "/v1/topology"),
  };
  for (const [name, go] of Object.entries(tries)) {
    try {
      const r = await go();
      out[name] = {type: r.type, status: r.status, text: r.type === "opaque" ? "" : await r.text()};
    } catch (e) { out[name] = {error: String(e)}; }
  }
  return out;
})()"""

FORM_POST = """(async () => {
  const frame = document.createElement("iframe");
  frame.name = "sink";
  document.body.appendChild(frame);
  const form = document.createElement("form");
  form.method = "POST"; form.action = %(node)s + "/v1/chat/completions"; form.enctype = "text/plain";
  form.target = "sink";
  const input = document.createElement("input");
  input.name = '{"messages": [{"role": "user", "content": "hi"}], "pad": "';
  input.value = '"}';
  form.appendChild(input);
  document.body.appendChild(form);
  const loaded = new Promise(resolve => frame.addEventListener("load", resolve));
  form.submit();
  await Promise.race([loaded, new Promise(resolve => setTimeout(resolve, 15000))]);
  try { return "read: " + frame.contentDocument.body.innerText; } catch (e) { return "blocked: " + e; }
})()"""

ALLOWED_PAGE = """(async () => {
  const node = %(node)s, body = %(body)s;
  const headers = {"Content-Type": "application/json", "Authorization": "Bearer none"};
  const chat = await (await fetch(node + "/v1/chat/completions", {method: "POST", headers, body})).json();
  const streamed = await (await fetch(node + "/v1/chat/completions",
    {method: "POST", headers, body: JSON.stringify({...JSON.parse(body), stream: true})})).text();
  const topology = await (await fetch(node + "/v1/topology")).json();
  return {chat: chat.choices[0].message.content, streamed, node_id: topology.node_id};
})()"""

OWN_ORIGIN_TRIES = """(async () => {
  const body = %(body)s, out = {};
  const tries = {
    topology: () => fetch("/v1/topology"),
    models: () => fetch("/v1/models"),
    chat: () => fetch("/v1/chat/completions", {method: "POST", headers: {"Content-Type": "application/json"}, body}),
  };
  for (const [name, go] of Object.entries(tries)) {
    try { const r = await go(); out[name] = {status: r.status, text: await r.text()}; }
    catch (e) { out[name] = {error: String(e)}; }
  }
  return out;
})()"""


def total_requests(node) -> int:
    status, body = node.get("/health")
    assert status == 200, body
    return body["total_requests"]


@pytest.fixture(scope="module")
def web(tmp_path_factory, llama):
    """(node, browser, page server's host ip): one host with the node, its page server and Chromium, shared
    by the module's tests (each counts requests from its own start)."""
    tmp_path = tmp_path_factory.mktemp("web")
    cluster = SwarmCluster(tmp_path, 1, ["--model", str(llama)])
    etc = None
    try:
        node = cluster.nodes[0]
        host = node.host
        etc = Path("/etc/netns") / host.ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n::1 localhost\n{host.ip} {REBIND_NAME}\n")
        pages = tmp_path / "pages"
        pages.mkdir()
        (pages / "page.html").write_text("<!doctype html><title>a page</title><body>a page</body>")
        host.spawn([sys.executable, "-m", "http.server", str(PAGE_PORT), "--bind", "0.0.0.0", "--directory",
                    str(pages)], label="pages")
        cluster.wait_serving(stages=1, timeout=180)
        with Browser(host, tmp_path / "chromium") as browser:
            yield node, browser, host.ip
    finally:
        cluster.close()
        if etc is not None:
            shutil.rmtree(etc, ignore_errors=True)


def test_pages_of_other_origins_run_nothing_and_read_nothing_and_allowed_ones_chat(web):
    node, browser, ip = web
    api = json.dumps(f"http://{ip}:{API_PORT}")
    before = total_requests(node)

    browser.open(f"http://{ip}:{PAGE_PORT}/page.html")  # another origin: same address, another port
    tried = browser.evaluate(FOREIGN_TRIES % {"node": api, "body": json.dumps(CHAT)})
    for name, result in tried.items():
        if result.get("type") == "opaque":  # no-cors: sent, and nothing comes back to the page
            assert result["status"] == 0 and result["text"] == "", (name, result)
        else:
            assert "error" in result, (name, result)  # CORS refused it: the page sees a network error
    # The no-cors POSTs reached the node (an answer the page cannot read): the unmoved counter below is the
    # node's refusal, not the browser's (Chromium's local-network rules) stopping them first.
    for name in ("no_cors", "ollama"):
        assert tried[name]["type"] == "opaque", (name, tried[name])
    form = browser.evaluate(FORM_POST % {"node": api})
    assert form.startswith("blocked"), form
    time.sleep(1.0)
    assert total_requests(node) == before, "a foreign page ran inference"

    browser.open(f"http://localhost:{PAGE_PORT}/page.html")  # a loopback page: allowed by default
    allowed = browser.evaluate(ALLOWED_PAGE % {"node": api, "body": json.dumps(CHAT)})
    assert isinstance(allowed["chat"], str)
    assert "data: [DONE]" in allowed["streamed"]
    assert allowed["node_id"] == node.topology()["node_id"]
    assert total_requests(node) == before + 2


def test_a_page_on_a_rebinding_name_is_refused(web):
    node, browser, ip = web
    before = total_requests(node)
    browser.open(f"http://{REBIND_NAME}:{API_PORT}/health")  # the name resolves to the node (its /etc/hosts)
    assert json.loads(browser.evaluate("document.body.innerText")) == {"status": "ok"}  # nothing more
    tried = browser.evaluate(OWN_ORIGIN_TRIES % {"body": json.dumps(CHAT)})
    for name, result in tried.items():
        assert result.get("status") == 403, (name, result)
        assert "node_id" not in result["text"] and "llama" not in result["text"].lower(), (name, result)
    assert total_requests(node) == before
