"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) of one real node process, driven by the
official `anthropic` client and raw HTTP: plain and streamed messages, stop reasons, tools, structured
output, the API key by `x-api-key`, fields without effect, and bad bodies answered in Anthropic's error shape.

The node has an API key, so every request here also passes through it (as a deployment would run).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import anthropic
import jsonschema
import openai
import pytest
from helpers import read_stream_events

KEY = "sk-swarm-anthropic-0123456789"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                            "properties": {"city": {"type": "string", "maxLength": 8},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
# One request at a time and no queue: a second one while a stream runs gets Anthropic's 429.
NODE_ARGS = ["--max-active", "1", "--max-queue", "0"]
NODE_ENV = {"SWARM_API_KEY": KEY}  # the conftest's node, with a key


@pytest.fixture(scope="module")
def claude(node):
    """The official anthropic client for the module's node."""
    return anthropic.Anthropic(base_url=node.url, api_key=KEY, max_retries=0, timeout=120)


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def post(node, path: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "x-api-key": KEY, "anthropic-version": "2023-06-01",
               **(headers or {})}
    req = urllib.request.Request(node.url + path, data=data, headers={k: v for k, v in headers.items() if v})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def test_a_plain_message_is_the_chat_completions_answer(node, claude, llama):
    reply = claude.messages.create(model=llama.name, max_tokens=12, messages=ASK)
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.model == llama.name
    assert [b.type for b in reply.content] == ["text"]
    chat = openai.OpenAI(base_url=node.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    same = chat.chat.completions.create(model=llama.name, max_tokens=12, messages=ASK)
    assert text_of(reply) == same.choices[0].message.content
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (same.usage.prompt_tokens,
                                                                     same.usage.completion_tokens)
    assert claude.messages.count_tokens(model=llama.name, messages=ASK).input_tokens == reply.usage.input_tokens


def test_a_streamed_message_sends_anthropics_events_and_the_same_text(node, claude, llama):
    kwargs = dict(model=llama.name, max_tokens=16, messages=ASK)
    whole = claude.messages.create(**kwargs)
    events = list(claude.messages.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    assert kinds[1:3] == ["content_block_start", "content_block_delta"] and "content_block_stop" in kinds
    assert events[0].message.usage.input_tokens == whole.usage.input_tokens
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == text_of(whole)
    assert events[-2].delta.stop_reason == whole.stop_reason
    assert events[-2].usage.output_tokens == whole.usage.output_tokens
    with claude.messages.stream(**kwargs) as stream:  # the SDK's own accumulation
        assert text_of(stream.get_final_message()) == text_of(whole)
    raw = urllib.request.urlopen(urllib.request.Request(
        node.url + "/v1/messages", data=json.dumps({**kwargs, "stream": True}).encode(),
        headers={"Content-Type": "application/json", "x-api-key": KEY}), timeout=120).read().decode()
    assert raw.startswith("event: message_start\n") and "event: ping\ndata: {\"type\":\"ping\"}" in raw


def test_stop_reasons_and_stop_sequences(claude, llama):
    long = claude.messages.create(model=llama.name, max_tokens=24, messages=ASK)
    text = text_of(long)
    assert long.stop_reason == "max_tokens" and long.usage.output_tokens == 24 and len(text) > 6, long
    stop = text[3:6]
    cut = claude.messages.create(model=llama.name, max_tokens=24, messages=ASK,
                                 stop_sequences=["never-there", stop])
    assert (cut.stop_reason, cut.stop_sequence, text_of(cut)) == ("stop_sequence", stop, text[:text.find(stop)])
    events = list(claude.messages.create(model=llama.name, max_tokens=24, messages=ASK,
                                         stop_sequences=[stop], stream=True))
    assert (events[-2].delta.stop_reason, events[-2].delta.stop_sequence) == ("stop_sequence", stop)


def test_sampling_fields_are_applied_and_max_tokens_0_generates_nothing(claude, llama):
    greedy = claude.messages.create(model=llama.name, max_tokens=12, messages=ASK)
    top_1 = claude.messages.create(model=llama.name, max_tokens=12, messages=ASK,
                                   extra_body={"temperature": 1.0, "top_k": 1})
    hot = [text_of(claude.messages.create(model=llama.name, max_tokens=12, messages=ASK,
                                          extra_body={"temperature": 1.0, "top_p": 1.0})) for _ in range(3)]
    assert text_of(top_1) == text_of(greedy) and any(t != text_of(greedy) for t in hot)
    warm = claude.messages.create(model=llama.name, max_tokens=0, messages=ASK)
    assert (warm.content, warm.stop_reason, warm.usage.output_tokens) == ([], "max_tokens", 0)
    assert warm.usage.input_tokens == greedy.usage.input_tokens
    kinds = [e.type for e in claude.messages.create(model=llama.name, max_tokens=0, messages=ASK, stream=True)]
    assert kinds == ["message_start", "message_delta", "message_stop"]


def test_system_as_a_string_or_blocks(claude, llama):
    as_string = claude.messages.create(model=llama.name, max_tokens=8, messages=ASK,
                                       system="You are terse.")
    as_blocks = claude.messages.create(model=llama.name, max_tokens=8, messages=ASK,
                                       system=[{"type": "text", "text": "You are terse."}])
    plain = claude.messages.create(model=llama.name, max_tokens=8, messages=ASK)
    assert as_string.usage.input_tokens == as_blocks.usage.input_tokens > plain.usage.input_tokens
    assert text_of(as_string) == text_of(as_blocks)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_round_trip_with_tool_choice_any(claude, llama, stream):
    kwargs = dict(model=llama.name, max_tokens=120, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"},
                  extra_body={"temperature": 1.0})
    if stream:
        with claude.messages.stream(**kwargs) as s:
            asked = s.get_final_message()
    else:
        asked = claude.messages.create(**kwargs)
    assert asked.stop_reason == "tool_use", asked
    [use] = [b for b in asked.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER["input_schema"])
    answer = claude.messages.create(model=llama.name, max_tokens=10, tools=[WEATHER], messages=[
        *ASK, {"role": "assistant", "content": asked.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}]}])
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content
    counted = claude.messages.count_tokens(model=llama.name, messages=ASK, tools=[WEATHER])
    assert counted.input_tokens > claude.messages.count_tokens(model=llama.name, messages=ASK).input_tokens


def test_a_conversation_with_tool_calls_is_the_chat_completions_prompt(node, claude, llama):
    """tool_use and tool_result blocks reach the chat template as chat completions' tool_calls and tool
    messages do: the same prompt, token for token, and the same greedy answer."""
    anthropic_messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "days": 1}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome", "days": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "rain"}]},
            {"type": "text", "text": "Which is nicer?"}]}]
    chat_messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}},
            {"id": "toolu_2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "rain"},
        {"role": "user", "content": "Which is nicer?"}]
    tool = {"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"],
                                             "parameters": WEATHER["input_schema"]}}
    reply = claude.messages.create(model=llama.name, max_tokens=8, system="Be brief.", messages=anthropic_messages,
                                   tools=[WEATHER])
    chat = openai.OpenAI(base_url=node.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    same = chat.chat.completions.create(model=llama.name, max_tokens=8, messages=chat_messages, tools=[tool])
    assert reply.usage.input_tokens == same.usage.prompt_tokens
    assert text_of(reply) == same.choices[0].message.content
    counted = claude.messages.count_tokens(model=llama.name, system="Be brief.", messages=anthropic_messages,
                                           tools=[WEATHER])
    assert counted.input_tokens == same.usage.prompt_tokens


def test_a_named_tool_and_tool_choice_none(claude, llama):
    named = claude.messages.create(model=llama.name, max_tokens=120, messages=ASK, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather"})
    assert named.stop_reason == "tool_use" and [b.type for b in named.content] == ["tool_use"]
    none = claude.messages.create(model=llama.name, max_tokens=8, messages=ASK, tools=[WEATHER],
                                  tool_choice={"type": "none"})
    plain = claude.messages.create(model=llama.name, max_tokens=8, messages=ASK)
    assert text_of(none) == text_of(plain) and none.usage.input_tokens == plain.usage.input_tokens


def test_output_config_format_holds_its_schema(claude, llama):
    reply = claude.messages.create(model=llama.name, max_tokens=80, messages=ASK, extra_body={"temperature": 1.0},
                                   output_config={"format": {"type": "json_schema", "schema": PERSON}})
    assert reply.stop_reason == "end_turn", reply
    jsonschema.validate(json.loads(text_of(reply)), PERSON)


def test_fields_without_effect_are_accepted_and_named(node, llama):
    base = {"model": llama.name, "max_tokens": 6, "messages": ASK, "temperature": 0}
    status, plain, headers = post(node, "/v1/messages", base)
    assert status == 200 and "x-swarm-ignored" not in {k.lower() for k in headers}
    status, reply, headers = post(node, "/v1/messages", {
        **base, "metadata": {"user_id": "u-1"}, "service_tier": "auto", "thinking": {"type": "disabled"},
        "output_config": {"effort": "low"}, "cache_control": {"type": "ephemeral"}})
    assert status == 200, reply
    named = {k.lower(): v for k, v in headers.items()}["x-swarm-ignored"].split(", ")
    assert sorted(named) == sorted(["metadata", "service_tier", "thinking", "output_config.effort",
                                    "cache_control"])
    assert reply["content"] == plain["content"]
    marked = [{"role": "user", "content": [{"type": "text", "text": ASK[0]["content"],
                                            "cache_control": {"type": "ephemeral"}}]}]
    status, reply, headers = post(node, "/v1/messages", {**base, "messages": marked})
    assert status == 200 and {k.lower(): v for k, v in headers.items()}["x-swarm-ignored"] == "cache_control"
    assert reply["content"] == plain["content"]
    streamed = urllib.request.Request(node.url + "/v1/messages", headers={
        "Content-Type": "application/json", "x-api-key": KEY},
        data=json.dumps({**base, "stream": True, "metadata": {"user_id": "u-1"}}).encode())
    with urllib.request.urlopen(streamed, timeout=120) as r:
        assert r.headers["x-swarm-ignored"] == "metadata" and b"event: message_stop" in r.read()


def test_the_key_may_come_as_x_api_key_and_a_missing_one_is_anthropics_401(node, llama):
    with_header = anthropic.Anthropic(base_url=node.url, api_key=None, auth_token=None, max_retries=0,
                                      default_headers={"x-api-key": KEY})
    assert with_header.messages.create(model=llama.name, max_tokens=2, messages=ASK).type == "message"
    with pytest.raises(anthropic.AuthenticationError) as caught:
        anthropic.Anthropic(base_url=node.url, api_key="sk-wrong", max_retries=0).messages.create(
            model=llama.name, max_tokens=2, messages=ASK)
    assert caught.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                            "message": "Incorrect API key provided."}}
    status, body, _ = post(node, "/v1/messages", {"max_tokens": 2, "messages": ASK}, {"x-api-key": None})
    assert status == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert "x-api-key" in body["error"]["message"]
    status, body, _ = post(node, "/v1/messages/count_tokens", {"messages": ASK}, {"x-api-key": "sk-wrong"})
    assert status == 401 and body["error"]["type"] == "authentication_error"


def msg(**fields) -> dict:
    return {"model": "llama", "max_tokens": 4, "messages": ASK, **fields}


def user(*blocks) -> list[dict]:
    return [{"role": "user", "content": list(blocks)}]


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
BAD_BODIES = [  # (body, status, words the message holds)
    (b"{not json", 400, ["JSON"]),
    (b"[1, 2]", 400, ["object"]),
    ({"model": "llama", "messages": ASK}, 400, ["max_tokens"]),
    ({"model": "llama", "max_tokens": 4}, 400, ["messages"]),
    (msg(max_tokens="ten"), 400, ["max_tokens"]),
    (msg(max_tokens=-1), 400, ["max_tokens"]),
    (msg(max_tokens=10**9), 400, ["max_tokens"]),
    (msg(temperature=1.5), 400, ["temperature"]),
    (msg(top_k=-1), 400, ["top_k"]),
    (msg(stop_sequences="x"), 400, ["stop_sequences"]),
    (msg(stream="yes"), 400, ["stream"]),
    (msg(model="claude-opus-4-1"), 404, ["claude-opus-4-1"]),
    (msg(messages=[{"role": "system", "content": "x"}]), 400, ["role"]),
    (msg(messages=[{"role": "user", "content": 5}]), 400, ["content"]),
    (msg(messages=[{"role": "user", "content": []}]), 400, ["content"]),
    (msg(messages=user(IMAGE)), 400, ["image"]),
    (msg(messages=user({"type": "document", "source": {"type": "text", "data": "x"}})), 400, ["document"]),
    (msg(messages=user({"type": "hologram", "text": "x"})), 400, ["hologram"]),
    (msg(messages=user({"type": "tool_result", "tool_use_id": "toolu_nowhere", "content": "x"})), 400,
     ["toolu_nowhere"]),
    (msg(messages=[*ASK, {"role": "assistant", "content": "The answer is"}]), 400, ["prefill"]),
    (msg(tools=[{"name": "f"}]), 400, ["input_schema"]),
    (msg(tools=[{"type": "web_search_20250305", "name": "web_search"}]), 400, ["server tool"]),
    (msg(tools=[{"name": "bad name!", "input_schema": {"type": "object"}}]), 400, ["name"]),
    (msg(tool_choice={"type": "any"}), 400, ["tools"]),
    (msg(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}), 400, ["nope"]),
    (msg(tools=[WEATHER], tool_choice="auto"), 400, ["tool_choice"]),
    (msg(thinking={"type": "enabled", "budget_tokens": 1024}), 400, ["thinking"]),
    (msg(container="c-1"), 400, ["container"]),
    (msg(metadata={"user_id": 5}), 400, ["metadata"]),
    (msg(service_tier="turbo"), 400, ["service_tier"]),
    (msg(system=[{"type": "image"}]), 400, ["system"]),
    (msg(messages=[{"role": "user", "content": "x" * 3_000_000}]), 400, ["context"]),
    (msg(output_config={"format": {"type": "json_schema"}}), 400, ["output_config"]),
    (b'{"max_tokens": 4, "messages": [{"role": "user", "content": "hi \\ud800"}]}', 400, ["Unicode"]),
    (msg(tools=[{"name": "f", "description": "\ud800", "input_schema": {"type": "object"}}]), 400, ["Unicode"]),
]


@pytest.mark.parametrize("body,status,words", BAD_BODIES, ids=[str(i) for i in range(len(BAD_BODIES))])
def test_bad_bodies_get_anthropics_error_shape(node, body, status, words):
    got, payload, _ = post(node, "/v1/messages", body)
    assert got == status, payload
    assert set(payload) == {"type", "error"} and payload["type"] == "error", payload
    assert set(payload["error"]) == {"type", "message"}, payload
    assert payload["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert all(w in payload["error"]["message"] for w in words), payload["error"]["message"]


def test_the_node_keeps_serving_after_bad_bodies(node, claude, llama):
    for body, _, _ in BAD_BODIES[:5]:
        post(node, "/v1/messages", body)
    status, payload, _ = post(node, "/v1/messages/count_tokens", {"messages": user(IMAGE)})
    assert status == 400 and payload["error"]["type"] == "invalid_request_error"
    status, payload, _ = post(node, "/v1/messages", b'{"x": "' + b"a" * (5 * 1024 * 1024) + b'"}')
    assert status == 413 and payload["error"]["type"] == "request_too_large", payload
    many = {"max_tokens": 2, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
            * 40_000 + ASK}  # ~3 MB of messages: more than any context holds
    status, payload, _ = post(node, "/v1/messages", many)
    assert status == 400 and "context" in payload["error"]["message"], payload
    status, payload, _ = post(node, "/v1/messages/nothing", {"messages": ASK})
    assert status == 404 and payload["error"]["type"] == "not_found_error"
    assert claude.messages.create(model=llama.name, max_tokens=2, messages=ASK).type == "message"
    assert node.health()[0] == 200


def test_a_full_node_is_anthropics_429_and_a_client_gone_mid_stream_frees_its_request(node, llama):
    # The tiny llama's greedy answer to this runs past 1,000 tokens: a stream that outlasts a client.
    body = json.dumps({"model": llama.name, "max_tokens": 4000, "stream": True, "temperature": 0,
                       "messages": [{"role": "user", "content": "Count to a thousand."}]}).encode()
    with socket.create_connection(("127.0.0.1", node.api_port)) as s:
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  + f"x-api-key: {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        seen = read_stream_events(s, b"content_block_delta", 3)
        assert seen.index(b"event: message_start") < seen.index(b"event: ping") < seen.index(b"content_block_start")
        status, payload, headers = post(node, "/v1/messages", {"max_tokens": 2, "messages": ASK})
        assert status == 429 and payload["error"]["type"] == "rate_limit_error", payload
        assert int({k.lower(): v for k, v in headers.items()}["retry-after"]) >= 1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(urllib.request.Request(node.url + "/health", headers={"x-api-key": KEY}),
                                    timeout=30) as r:
            health = json.loads(r.read())  # with the key: the whole health, caches included
        if health["active_requests"] == 0 and health["cached_requests"] == 0:
            break
        time.sleep(0.1)
    assert health["active_requests"] == 0 and health["cached_requests"] == 0, health
