"""The unchanged `anthropic` client against a swarm of three `swarm-node` processes on network-namespace
hosts serving the default model: a plain message (the same greedy text as chat completions), a streamed
one, a tool round trip with tool_choice {"type": "any"}, count_tokens. Once through an open swarm, once
through a swarm with a secret (sealed links) and an API key, which the client sends as `x-api-key`.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from helpers import http_json
from netns import netns_unavailable_reason
from netns_client import in_netns
from swarm_cluster import serving_swarm

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-swarm-netns-anthropic-42"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "additionalProperties": False, "required": ["city"],
                            "properties": {"city": {"type": "string", "maxLength": 30}}}}


@pytest.fixture(scope="module", params=["open", "secret+key"])
def swarm(request, tmp_path_factory, default_swarm):
    secured = request.param == "secret+key"
    if not secured:
        yield default_swarm
        return
    with serving_swarm(tmp_path_factory.mktemp(request.param.replace("+", "-")), 3, [], stages=3,
                       secret="anthropic-netns-secret" if secured else None,
                       api_key=KEY if secured else None) as cluster:
        yield cluster


def call(swarm, fn):
    """fn(anthropic client) from inside the entry's host; with a key, the client sends it as x-api-key."""
    entry = swarm.nodes[0]

    def run():
        client = anthropic.Anthropic(base_url=entry.url, api_key=None if swarm.api_key else "none",
                                     default_headers={"x-api-key": swarm.api_key} if swarm.api_key else None,
                                     max_retries=0, timeout=300)
        return fn(client)
    return in_netns(entry.host.ns, run)


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_a_plain_message_is_chat_completions_greedy_text(swarm):
    reply = call(swarm, lambda c: c.messages.create(model=MODEL, max_tokens=24, messages=ASK))
    assert "Paris" in text_of(reply) and reply.stop_reason == "end_turn", reply

    def chat():
        client = openai.OpenAI(base_url=swarm.nodes[0].url + "/v1", api_key=swarm.api_key or "none",
                               max_retries=0, timeout=300)
        return client.chat.completions.create(model=MODEL, max_tokens=24, messages=ASK)
    same = in_netns(swarm.nodes[0].host.ns, chat)
    assert text_of(reply) == same.choices[0].message.content
    assert reply.usage.input_tokens == same.usage.prompt_tokens
    counted = call(swarm, lambda c: c.messages.count_tokens(model=MODEL, messages=ASK))
    assert counted.input_tokens == reply.usage.input_tokens


def test_a_streamed_message(swarm):
    def stream(client):
        kinds = []
        with client.messages.stream(model=MODEL, max_tokens=24, messages=ASK) as s:
            for event in s:
                kinds.append(event.type)
            return kinds, s.get_final_message()
    kinds, final = call(swarm, stream)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert "Paris" in text_of(final) and final.stop_reason == "end_turn"


def test_a_tool_round_trip(swarm):
    ask = [{"role": "user", "content": "What is the weather in Lisbon right now?"}]
    asked = call(swarm, lambda c: c.messages.create(model=MODEL, max_tokens=80, messages=ask, tools=[WEATHER],
                                                    tool_choice={"type": "any"}))
    assert asked.stop_reason == "tool_use", asked
    [use] = [b for b in asked.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input.get("city"), str), use
    conversation = [*ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in asked.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                  "content": json.dumps({"sky": "sunny", "celsius": 24})}]}]
    answer = call(swarm, lambda c: c.messages.create(model=MODEL, max_tokens=40, messages=conversation,
                                                     tools=[WEATHER]))
    assert answer.stop_reason in ("end_turn", "tool_use", "max_tokens") and answer.content, answer
    counted = call(swarm, lambda c: c.messages.count_tokens(model=MODEL, messages=conversation, tools=[WEATHER]))
    assert counted.input_tokens == answer.usage.input_tokens


def test_without_the_key_a_secured_swarm_answers_anthropics_401(swarm):
    if not swarm.api_key:
        pytest.skip("the open swarm takes anyone")
    entry = swarm.nodes[0]
    status, body = in_netns(entry.host.ns, http_json, entry.url + "/v1/messages",
                            {"model": MODEL, "max_tokens": 4, "messages": ASK})
    assert status == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error", body
