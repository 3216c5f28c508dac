"""The optional API key against a real node, with the official openai client: the right key is
served, a wrong or missing one gets OpenAI's 401, and /health stays open but tells a caller
without the key nothing but whether the node serves."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest
from helpers import openai_client
from node_process import running_node
from swarm.bench.cluster import get_json
from reference import reference_chat

from tui.client import NodeClient

KEY = "sk-swarm-test-0123456789"
MESSAGES = [{"role": "user", "content": "Say hello"}]
NODE_ENV = {"SWARM_API_KEY": KEY}  # the key from the environment, as a deployment would pass it


def get(node, path: str, key: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(node.url + path, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            if path.endswith("/events"):  # an endless stream: its first event is enough
                return r.status, {"first_line": r.readline().decode()}
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_right_key_is_served(node, llama):
    expected, _ = reference_chat(llama, MESSAGES, 8)
    reply = openai_client(node.url, KEY).chat.completions.create(model=llama.name, messages=MESSAGES,
                                                                 max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == expected
    assert [m.id for m in openai_client(node.url, KEY).models.list()] == [llama.name]


def test_a_wrong_key_is_a_401_in_openais_shape(node):
    with pytest.raises(openai.AuthenticationError) as caught:
        openai_client(node.url, "sk-wrong").chat.completions.create(model="llama", messages=MESSAGES,
                                                                    max_tokens=2)
    assert caught.value.status_code == 401
    assert caught.value.body["code"] == "invalid_api_key" and "Incorrect API key" in caught.value.body["message"]
    with pytest.raises(openai.AuthenticationError):
        openai_client(node.url, "sk-wrong").models.list()


def test_no_key_is_a_401(node):
    for path in ("/v1/models", "/v1/topology", "/v1/topology/events"):
        status, body = get(node, path)
        assert status == 401 and body["error"]["code"] == "invalid_api_key", (path, body)
        assert "didn't provide an API key" in body["error"]["message"]
    req = urllib.request.Request(node.url + "/v1/chat/completions", data=json.dumps({"messages": MESSAGES}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(req, timeout=30)
    assert caught.value.code == 401 and caught.value.headers["WWW-Authenticate"].startswith("Bearer")


def test_topology_and_its_events_need_the_key(node):
    status, topology = get(node, "/v1/topology", KEY)
    assert status == 200 and topology["security"] == {**topology["security"], "api_key": True}
    status, events = get(node, "/v1/topology/events", KEY)  # the stream opens with the key
    assert status == 200 and events["first_line"].startswith("event: snapshot")


def test_health_stays_open_and_says_little_without_the_key(node):
    status, open_health = get_json(node.url + "/health")
    assert status == 200 and open_health["status"] == "ok"
    assert open_health["security"]["api_key"] is True
    assert "node_id" not in open_health and "plan_id" not in open_health and "peer_connections" not in open_health
    assert {"active_requests", "tokens_per_second", "total_requests", "total_tokens"} <= set(open_health)
    status, full = get(node, "/health", KEY)
    assert status == 200 and full["node_id"] and full["security"]["api_key"] is True


async def test_the_dashboards_client_sends_the_key(node):
    with_key, without = NodeClient(api_key=KEY), NodeClient()
    try:
        assert (await with_key.topology(node.url))["security"]["api_key"] is True
        with pytest.raises(Exception, match="401"):
            await without.topology(node.url)
    finally:
        await with_key.close()
        await without.close()


def test_a_node_without_a_key_says_so(tmp_path, llama):
    with running_node(tmp_path, "--model", str(llama)) as n:
        status, health = get_json(n.url + "/health")
        assert status == 200 and health["security"]["api_key"] is False and health["node_id"]
        status, topology = get_json(n.url + "/v1/topology")
        assert status == 200 and topology["security"]["api_key"] is False
