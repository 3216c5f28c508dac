"""The unchanged `openai` (Responses) and `ollama` clients against swarms of three `swarm-node` processes on
network-namespace hosts.

Two swarms, each checked with every test: an open one serving the default model (whose answers
can be read: "Paris"), and one with a secret (sealed links) and an API key serving a tiny random
model whose chat template renders tools, where `<tool_call>` is a token of its own. Ollama has no
tool_choice, so a model-initiated call needs a model that calls when it likes; the default model
never does (it answers in prose), so on its swarm the tool test sends a call and its result back. On the
open swarm a streamed Responses answer also goes on unchanged through a kill -9 of its last stage.
"""

from __future__ import annotations

import json
import threading
import time

import jsonschema
import ollama
import openai
import pytest
from helpers import http_json
from netns import netns_unavailable_reason
from netns_client import in_netns
from swarm_cluster import serving_swarm

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

DEFAULT = "SmolLM2-135M-Instruct"
KEY = "sk-swarm-netns-faces-7"
ASK = "What is the capital of France?"
WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                          "properties": {"city": {"type": "string", "maxLength": 20}}}}
# The ollama client sends a tool through its Tool model, which drops additionalProperties.
OLLAMA_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"enum": ["Paris", "Rome"]}}}}}
PLACE = {"type": "object", "additionalProperties": False, "required": ["city", "country"],
         "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}}}


@pytest.fixture(scope="module", params=["open", "secret+key"])
def swarm(request, tmp_path_factory, default_swarm, random_model):
    if request.param == "open":
        default_swarm.model = DEFAULT
        yield default_swarm
        return
    model = random_model("qwen2", seed=3, tools_template=True)
    with serving_swarm(tmp_path_factory.mktemp("secret-key"), 3, ["--model", str(model)], stages=3,
                       secret="faces-netns-secret", api_key=KEY) as cluster:
        cluster.model = "qwen2"
        yield cluster


def with_openai(swarm, fn):
    entry = swarm.nodes[0]

    def run():
        return fn(openai.OpenAI(base_url=entry.url + "/v1", api_key=swarm.api_key or "none", max_retries=0,
                                timeout=300))
    return in_netns(entry.host.ns, run)


def with_ollama(swarm, fn):
    entry = swarm.nodes[0]

    def run():
        headers = {"Authorization": f"Bearer {swarm.api_key}"} if swarm.api_key else None
        return fn(ollama.Client(host=entry.url, headers=headers, timeout=300))
    return in_netns(entry.host.ns, run)


def chat_text(swarm, messages: list[dict], max_tokens: int) -> str:
    return with_openai(swarm, lambda c: c.chat.completions.create(
        model=swarm.model, messages=messages, max_tokens=max_tokens, temperature=0)).choices[0].message.content


def test_responses_plain_and_streamed_are_the_chat_completions_text(swarm):
    r = with_openai(swarm, lambda c: c.responses.create(model=swarm.model, input=ASK, max_output_tokens=16,
                                                        temperature=0))
    assert r.output_text == chat_text(swarm, [{"role": "user", "content": ASK}], 16)
    if swarm.model == DEFAULT:
        assert "Paris" in r.output_text and r.status == "completed", r

    def stream(c):
        return list(c.responses.create(model=swarm.model, input=ASK, max_output_tokens=16, temperature=0,
                                       stream=True))
    events = with_openai(swarm, stream)
    assert events[0].type == "response.created" and events[-1].type == f"response.{r.status}"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text


def test_responses_function_call_round_trip_with_previous_response_id(swarm):
    ask = "What is the weather in Lisbon right now?"
    first = with_openai(swarm, lambda c: c.responses.create(model=swarm.model, input=ask, tools=[WEATHER],
                                                            tool_choice="required", max_output_tokens=60,
                                                            temperature=0))
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather", first
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    result = [{"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}]
    follow = with_openai(swarm, lambda c: c.responses.create(model=swarm.model, previous_response_id=first.id,
                                                             input=result, tools=[WEATHER], max_output_tokens=12,
                                                             temperature=0))
    assert follow.previous_response_id == first.id and follow.usage.input_tokens > first.usage.input_tokens
    whole = with_openai(swarm, lambda c: c.responses.create(
        model=swarm.model, tools=[WEATHER], max_output_tokens=12, temperature=0,
        input=[{"role": "user", "content": ask}, call.model_dump(include={"type", "call_id", "name", "arguments"}),
               *result]))
    assert whole.output_text == follow.output_text


def test_responses_json_schema_follows_its_schema(swarm):
    r = with_openai(swarm, lambda c: c.responses.create(
        model=swarm.model, input="Name a city and its country, as JSON.", max_output_tokens=60, temperature=0,
        text={"format": {"type": "json_schema", "name": "place", "schema": PLACE, "strict": True}}))
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), PLACE)


def test_ollama_chat_generate_list_show(swarm):
    messages = [{"role": "user", "content": ASK}]
    want = chat_text(swarm, messages, 16)
    options = {"temperature": 0, "num_predict": 16}
    r = with_ollama(swarm, lambda c: c.chat(model=swarm.model, messages=messages, options=options))
    assert r.message.content == want and r.done
    parts = with_ollama(swarm, lambda c: list(c.chat(model=swarm.model, messages=messages, options=options,
                                                     stream=True)))
    assert "".join(p.message.content for p in parts) == want and parts[-1].done
    g = with_ollama(swarm, lambda c: c.generate(model=swarm.model, prompt=ASK, options=options))
    assert g.response == want
    if swarm.model == DEFAULT:
        assert "Paris" in want
    [listed] = with_ollama(swarm, lambda c: c.list()).models
    assert listed.model == f"{swarm.model}:latest" and listed.size > 0
    shown = with_ollama(swarm, lambda c: c.show(listed.model))
    assert shown.details.family in ("llama", "qwen2") and "tools" in shown.capabilities
    assert with_ollama(swarm, lambda c: c.ps()).models[0].model == listed.model


def test_ollama_tool_call(swarm):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    if swarm.model == DEFAULT:  # it never calls by itself: a call and its result go back, it answers on
        calls = [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    else:
        def first_call(c):
            for seed in range(16):
                r = c.chat(model=swarm.model, messages=ask, tools=[OLLAMA_WEATHER],
                           options={"temperature": 1.0, "seed": seed, "num_predict": 200})
                if r.message.tool_calls:
                    return r.message.tool_calls
            raise AssertionError("no tool call in 16 seeds")
        calls = with_ollama(swarm, first_call)
        for call in calls:
            assert call.function.name == "get_weather"
            jsonschema.validate(dict(call.function.arguments), OLLAMA_WEATHER["function"]["parameters"])
    conversation = [*ask, {"role": "assistant", "content": "", "tool_calls": calls},
                    {"role": "tool", "tool_name": "get_weather", "content": "sunny, 24 C"}]
    answer = with_ollama(swarm, lambda c: c.chat(model=swarm.model, messages=conversation, tools=[OLLAMA_WEATHER],
                                                 options={"temperature": 0, "num_predict": 16}))
    assert answer.done and answer.message.content
    if swarm.model == DEFAULT:
        assert "sunny" in answer.message.content.lower() or "24" in answer.message.content, answer


def test_without_the_key_each_face_answers_401_in_its_shape(swarm):
    if not swarm.api_key:
        pytest.skip("the open swarm takes anyone")
    entry = swarm.nodes[0]
    status, body = in_netns(entry.host.ns, http_json, entry.url + "/api/chat", {"model": swarm.model,
                                                                              "messages": []})
    assert status == 401 and list(body) == ["error"] and isinstance(body["error"], str), body
    status, body = in_netns(entry.host.ns, http_json, entry.url + "/v1/responses", {"input": "hi"})
    assert status == 401 and body["error"]["code"] == "invalid_api_key", body


def test_a_responses_stream_goes_on_through_a_kill_9_unchanged(swarm):
    """Mid-answer the last stage is killed: the survivors re-plan, the entry replays the request, and the
    Responses events go on as if nothing happened (the face sees only the service's text)."""
    if swarm.model != DEFAULT:
        pytest.skip("once is enough: the open swarm")
    swarm.restore()
    entry, doomed = swarm.nodes[0], swarm.nodes[2]
    kwargs = dict(model=DEFAULT, input="Tell me a story about a cat and a dog.", max_output_tokens=60, temperature=0)
    undisturbed = with_openai(swarm, lambda c: c.responses.create(**kwargs))
    assert undisturbed.usage.output_tokens > 20, "long enough to be killed in the middle of"
    events: list = []
    failure: list = []

    def consume():
        try:
            events.extend(with_openai(swarm, lambda c: list(c.responses.create(stream=True, **kwargs))))
        except BaseException as e:  # handed to the test
            failure.append(e)
    replays = entry.proc.logs(10_000).count("replaying")
    before = entry.get("/health")[1]["total_tokens"]
    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while entry.get("/health")[1]["total_tokens"] - before < 4:
        assert time.monotonic() < deadline and thread.is_alive(), "the stream did not start"
        time.sleep(0.05)
    doomed.proc.kill9()
    at_kill = entry.get("/health")[1]["total_tokens"] - before
    thread.join(300)
    assert not thread.is_alive() and not failure, failure
    assert at_kill + 3 <= undisturbed.usage.output_tokens, f"the kill came too late ({at_kill} tokens in)"
    assert entry.proc.logs(10_000).count("replaying") > replays, "the entry replayed the request"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == undisturbed.output_text
    assert events[-1].type == f"response.{undisturbed.status}"
    assert events[-1].response.usage.output_tokens == undisturbed.usage.output_tokens
    doomed.start()  # serving again by the next user's restore (default_swarm): no test left waits for it after the last
