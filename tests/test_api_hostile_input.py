"""Hostile HTTP bodies against a real node: each gets a 4xx naming the problem, none a 500,
and none leaves the node holding more memory."""

from __future__ import annotations

import gzip
import json

import psutil
import pytest
from helpers import post_raw

CHAT = "/v1/chat/completions"


def chat_bytes(**fields) -> bytes:
    """A small chat request's body with these fields, as bytes (a test may then corrupt them)."""
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}).encode()


def assert_client_error(status: int, payload: dict, *words: str) -> None:
    assert 400 <= status < 500, payload
    message = payload["error"]["message"]
    assert all(w in message for w in words), message


def test_deeply_nested_json_is_a_400(node):
    status, payload = post_raw(node, CHAT, b"[" * 100_000 + b"]" * 100_000)
    assert_client_error(status, payload, "nested")
    status, payload = post_raw(node, CHAT, b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    assert_client_error(status, payload, "nested")


@pytest.mark.parametrize("field,value", [("top_k", 2**64), ("top_k", 2**40), ("seed", 2**70),
                                         ("max_tokens", 2**64), ("temperature", 1e400)])
def test_numbers_out_of_any_sane_range_are_a_400(node, field, value):
    body = chat_bytes(**{field: value}) if value != 1e400 else chat_bytes().replace(b'"max_tokens"', b'"temperature": 1e400, "max_tokens"')
    status, payload = post_raw(node, CHAT, body)
    assert_client_error(status, payload, field)
    assert payload["error"]["param"] == field


def test_a_lone_surrogate_in_content_is_a_400(node):
    body = b'{"messages": [{"role": "user", "content": "hi \\ud800 there"}], "max_tokens": 2}'
    status, payload = post_raw(node, CHAT, body)
    assert_client_error(status, payload, "Unicode")
    body = b'{"prompt": "x\\udfff", "max_tokens": 2}'
    status, payload = post_raw(node, "/v1/completions", body)
    assert_client_error(status, payload, "Unicode")


def test_a_false_content_encoding_is_a_400_and_a_true_one_works(node):
    status, payload = post_raw(node, CHAT, chat_bytes(), {"Content-Encoding": "gzip"})
    assert_client_error(status, payload)
    status, payload = post_raw(node, CHAT, chat_bytes(), {"Content-Encoding": "br-unknown"})
    assert_client_error(status, payload)
    status, payload = post_raw(node, CHAT, gzip.compress(chat_bytes(temperature=0)), {"Content-Encoding": "gzip"})
    assert status == 200, payload


def test_big_bodies_do_not_raise_the_nodes_memory_for_good(node):
    proc = psutil.Process(node.proc.pid)
    post_raw(node, CHAT, chat_bytes(temperature=0))
    before = proc.memory_info().rss
    text = "hello world " * 320_000  # ~3.8 MB of prompt: far past any context
    for _ in range(3):
        status, payload = post_raw(node, CHAT, json.dumps({"messages": [{"role": "user", "content": text}]}).encode())
        assert_client_error(status, payload, "context")
    many = json.dumps({"messages": [{"role": "user", "content": "x"}] * 150_000}).encode()  # ~3.9 MB of objects
    status, payload = post_raw(node, CHAT, many)
    assert 400 <= status < 500
    grown = proc.memory_info().rss - before
    print(f"RSS {before / 2**20:.0f} MiB -> +{grown / 2**20:.0f} MiB after 4 hostile bodies of ~4 MB")
    assert grown < 60 * 2**20
    assert post_raw(node, CHAT, chat_bytes(temperature=0))[0] == 200
