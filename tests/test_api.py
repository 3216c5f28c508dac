"""The chat API of one real node process, driven by the official openai client and raw HTTP."""

from __future__ import annotations

import json

import pytest
from helpers import assert_gone_mid_stream_frees, openai_client, post_raw
from node_process import running_node
from swarm.bench.cluster import get_json


def test_health_and_models(node, client):
    status, body = node.health()
    assert status == 200 and body["status"] == "ok" and body["node_id"]
    models = client.models.list()
    assert [m.id for m in models.data] == ["llama"]


def test_chat_non_streaming(client):
    r = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hello"}],
                                       max_tokens=12, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 3
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    again = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hello"}],
                                           max_tokens=12, temperature=0)
    assert again.choices[0].message.content == r.choices[0].message.content


def test_chat_streaming_equals_non_streaming(client):
    kwargs = dict(model="llama", messages=[{"role": "user", "content": "tell me"}], max_tokens=16, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_seeded_sampling_reproducible(client):
    kwargs = dict(model="llama", messages=[{"role": "user", "content": "x"}], max_tokens=16,
                  temperature=1.0, top_p=0.9, seed=7)
    a = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs).choices[0].message.content == a
    assert client.chat.completions.create(**{**kwargs, "seed": 8}).choices[0].message.content != a


def test_stop_strings_cut_the_text(client):
    base = client.completions.create(model="llama", prompt="abc", max_tokens=20, temperature=0)
    text = base.choices[0].text
    assert len(text) > 4
    stop = text[3:5]
    cut = client.completions.create(model="llama", prompt="abc", max_tokens=20, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_completions_streaming(client):
    chunks = list(client.completions.create(model="llama", prompt="hello", max_tokens=5, temperature=0, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"


BAD_BODIES = [
    (b"{not json", 400, None),
    (b"", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"messages": []}).encode(), 400, "messages"),
    (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
    (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "messages[0].role"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400, "messages[0].content"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**12}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": -1}).encode(), 400, "temperature"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "top_p": "a"}).encode(), 400, "top_p"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stop": 5}).encode(), 400, "stop"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(), 400, "stream"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 17}).encode(), 400, "n"),
    (json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).encode(), 404, "model"),
]


@pytest.mark.parametrize("body,status,param", BAD_BODIES)
def test_bad_chat_bodies_get_openai_errors(node, body, status, param):
    got, payload = post_raw(node, "/v1/chat/completions", body)
    assert got == status
    assert payload["error"]["message"] and payload["error"]["type"]
    assert payload["error"]["param"] == param


def test_oversized_body_and_unknown_routes(node):
    got, payload = post_raw(node, "/v1/chat/completions", b'{"x": "' + b"a" * (5 * 1024 * 1024) + b'"}')
    assert got == 413 and "too large" in payload["error"]["message"]
    assert get_json(node.url + "/v1/nothing")[0] == 404
    got, payload = post_raw(node, "/v1/completions", json.dumps({"prompt": ""}).encode())
    assert got == 400 and payload["error"]["param"] == "prompt"
    assert node.health()[0] == 200, "the node keeps serving after bad input"


def test_disconnect_mid_stream_frees_caches(node):
    # The tiny llama's greedy answer to this runs past 1,000 tokens: a stream that outlasts a client.
    assert_gone_mid_stream_frees(node, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Count to a thousand."}], "max_tokens": 4000, "temperature": 0,
        "stream": True}, b"data:")


def test_default_model_answers_through_the_api(tmp_path, default_model):
    with running_node(tmp_path) as node:
        client = openai_client(node.url)
        r = client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=12, temperature=0,
                                           messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in r.choices[0].message.content
        # The README's first example, as it is: no sampling fields, so the node's greedy default.
        status, reply = post_raw(node, "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "What is the capital of France?"}]}).encode())
        assert status == 200 and "Paris" in reply["choices"][0]["message"]["content"], reply
        assert reply["choices"][0]["finish_reason"] == "stop" and reply["usage"]["completion_tokens"] < 30, reply
