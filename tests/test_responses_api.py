"""POST /v1/responses on one real node (a tiny random-weight model), driven by the official openai client.

The answer must be the chat-completions answer to the same messages, streamed or not; tools,
text.format and previous_response_id go through the shared parsers and grammars; every bad
body is a 4xx in OpenAI's error shape naming its field, and the node keeps serving.
"""

from __future__ import annotations

import json
import urllib.request

import jsonschema
import openai
import pytest
from helpers import assert_gone_mid_stream_frees
from node_process import running_node

from swarm.api.errors import ApiError
from swarm.api.responses_store import ResponseStore

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                          "properties": {"city": {"enum": ["Paris", "Rome", "Lisbon"]}}}}
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0,
                                                                              "maximum": 120}}}


def post(node, body: bytes | dict, path: str = "/v1/responses") -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(node.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def test_greedy_text_equals_chat_completions(client):
    for ask, messages in [("hello", [{"role": "user", "content": "hello"}]),
                          ([{"role": "user", "content": [{"type": "input_text", "text": "tell "},
                                                         {"type": "input_text", "text": "me"}]}],
                           [{"role": "user", "content": "tell me"}])]:
        chat = client.chat.completions.create(model="llama", messages=[{"role": "system", "content": "Be brief."},
                                                                       *messages], max_tokens=12, temperature=0)
        r = client.responses.create(model="llama", instructions="Be brief.", input=ask, max_output_tokens=12,
                                    temperature=0)
        assert r.output_text == chat.choices[0].message.content
        assert r.usage.input_tokens == chat.usage.prompt_tokens
        assert r.usage.output_tokens == chat.usage.completion_tokens == 12
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_streamed_events_build_the_same_response(client):
    kwargs = dict(model="llama", input="tell me", max_output_tokens=10, temperature=0)
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    # The SDK's own accumulating helper checks the order of items and parts as it goes.
    with client.responses.stream(model="llama", input="tell me", max_output_tokens=10, temperature=0) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
    assert "".join(texts) == whole.output_text


def test_a_function_call_round_trip_with_and_without_previous_response_id(client):
    first = client.responses.create(model="llama", input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", max_output_tokens=200, temperature=0)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert first.status == "completed"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}
    follow = client.responses.create(model="llama", previous_response_id=first.id, input=[result], tools=[WEATHER],
                                     max_output_tokens=8, temperature=0)
    assert follow.previous_response_id == first.id and follow.output_text
    # The same conversation sent whole (what a client without the store does) gives the same answer.
    whole = client.responses.create(model="llama", tools=[WEATHER], max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        result])
    assert whole.output_text == follow.output_text
    assert whole.usage.input_tokens == follow.usage.input_tokens
    streamed = list(client.responses.create(model="llama", input="What is the weather in Paris?", tools=[WEATHER],
                                            tool_choice={"type": "function", "name": "get_weather"},
                                            max_output_tokens=200, temperature=0, stream=True))
    deltas = [e.delta for e in streamed if e.type == "response.function_call_arguments.delta"]
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert "".join(deltas) == done[0].arguments == call.arguments
    assert streamed[-1].type == "response.completed" and streamed[-1].response.output[0].call_id
    with client.responses.stream(model="llama", input="What is the weather in Paris?", tools=[WEATHER],
                                 tool_choice="required", max_output_tokens=200, temperature=0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()  # the SDK's accumulator rebuilt the call from the events
    assert final.output[0].arguments == call.arguments and final.output[0].name == "get_weather"


def test_text_format_json_schema_and_json_object(client):
    r = client.responses.create(model="llama", input="Invent a person.", max_output_tokens=120, temperature=0.8,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                                 "strict": True}})
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), PERSON)
    r = client.responses.create(model="llama", input="JSON please", max_output_tokens=60, temperature=0,
                                text={"format": {"type": "json_object"}})
    assert r.output_text.startswith("{")


def test_store_previous_ids_retrieve_and_delete(client, node):
    kept = client.responses.create(model="llama", input="hi", max_output_tokens=3, temperature=0)
    assert client.responses.retrieve(kept.id).output_text == kept.output_text
    unkept = client.responses.create(model="llama", input="hi", max_output_tokens=3, temperature=0, store=False)
    assert unkept.store is False
    for gone in (unkept.id, "resp_never_was"):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="llama", input="and?", previous_response_id=gone, max_output_tokens=3)
        assert e.value.body["param"] == "previous_response_id" and gone in e.value.body["message"]
        assert e.value.body["code"] == "previous_response_not_found"
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


def test_fields_that_change_nothing_are_accepted_and_named(node):
    status, body, headers = post(node, {"model": "llama", "input": "hi", "max_output_tokens": 2,
                                        "reasoning": {"effort": "low"}, "user": "u1", "service_tier": "auto",
                                        "include": ["reasoning.encrypted_content"], "truncation": "auto",
                                        "prompt_cache_key": "k", "text": {"verbosity": "low"}, "metadata": {"a": "b"}})
    assert status == 200, body
    assert headers["x-swarm-ignored"].split(", ") == ["reasoning", "user", "service_tier", "truncation",
                                                      "prompt_cache_key", "include", "text.verbosity"]
    assert body["metadata"] == {"a": "b"}
    assert "accepted and ignored (nothing here changes with them): reasoning, user" in node.log.read_text()
    assert "x-swarm-ignored" not in post(node, {"input": "hi", "max_output_tokens": 2})[2]


OK = {"model": "llama", "input": "hi", "max_output_tokens": 2}
BAD_BODIES = [
    (b"{not json", 400, None),
    (b"[1]", 400, None),
    ({"model": "llama"}, 400, "input"),
    ({**OK, "input": 5}, 400, "input"),
    ({**OK, "input": []}, 400, "input"),
    ({**OK, "input": [{"role": "wizard", "content": "x"}]}, 400, "input[0].role"),
    ({**OK, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
     "input[0].content[0]"),
    ({**OK, "input": [{"type": "reasoning", "summary": []}]}, 400, "input[0].type"),
    ({**OK, "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, 400, "input[0].call_id"),
    ({**OK, "input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}, 400, "input[0].output"),
    ({**OK, "input": "x\ud800"}, 400, "input"),
    ({**OK, "input": "word " * 200_000}, 400, "input"),
    ({**OK, "input": [{"role": "user", "content": "x"}] * 5000}, 400, "input"),
    ({**OK, "instructions": ["be brief"]}, 400, "instructions"),
    ({**OK, "instructions": "be \udfff brief"}, 400, "instructions"),
    ({**OK, "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({**OK, "max_output_tokens": "many"}, 400, "max_output_tokens"),
    ({**OK, "max_output_tokens": 10**9}, 400, "max_output_tokens"),
    ({**OK, "temperature": 3}, 400, "temperature"),
    ({**OK, "top_p": "x"}, 400, "top_p"),
    ({**OK, "stream": "yes"}, 400, "stream"),
    ({**OK, "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({**OK, "tools": [{"type": "function", "name": "bad name!"}]}, 400, "tools[0].name"),
    ({**OK, "tools": [{"type": "function", "name": "f", "description": "a\udfff"}]}, 400, "tools[0]"),
    ({**OK, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice"),
    ({**OK, "tool_choice": "required"}, 400, "tool_choice"),
    ({**OK, "text": {"format": {"type": "yaml"}}}, 400, "text.format"),
    ({**OK, "text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format"),
    ({**OK, "tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, 400, "text.format"),
    ({**OK, "previous_response_id": 7}, 400, "previous_response_id"),
    ({**OK, "store": "no"}, 400, "store"),
    ({**OK, "background": True}, 400, "background"),
    ({**OK, "conversation": "conv_1"}, 400, "conversation"),
    ({**OK, "reasoning": "high"}, 400, "reasoning"),
    ({**OK, "include": ["reasoning.encrypted_content", "no.such.output"]}, 400, "include"),
    ({**OK, "top_logprobs": 50}, 400, "top_logprobs"),
    ({**OK, "frobnicate": 1}, 400, "frobnicate"),
    ({**OK, "model": "gpt-9"}, 404, "model"),
]


@pytest.mark.parametrize("body,status,param", BAD_BODIES)
def test_bad_bodies_get_openai_errors_naming_the_field(node, body, status, param):
    got, payload, _ = post(node, body)
    assert got == status, payload
    error = payload["error"]
    assert error["message"] and error["type"] and error["param"] == param, error


def test_the_node_keeps_serving_after_bad_bodies(node, client):
    for body, _, _ in BAD_BODIES:
        post(node, body)
    status, payload, _ = post(node, b'{"input": "' + b"a" * (5 * 1024 * 1024) + b'"}')
    assert status == 413 and payload["error"]["message"]
    assert client.responses.create(model="llama", input="hi", max_output_tokens=2).output_text is not None
    assert node.health()[0] == 200


def test_the_store_is_bounded_in_count_size_and_age():
    now = [0.0]
    store = ResponseStore(max_responses=3, max_chars=2000, max_age_s=60, clock=lambda: now[0])
    conversation = [{"role": "user", "content": "x" * 100}]
    for i in range(5):
        store.put({"id": f"resp_{i}"}, conversation)
    assert len(store) == 3 and store.conversation("resp_4") == conversation
    with pytest.raises(ApiError) as e:
        store.conversation("resp_0")
    assert e.value.status == 400 and e.value.param == "previous_response_id"
    store.put({"id": "big"}, [{"role": "user", "content": "x" * 1500}])  # pushes older ones out by size
    assert "big" in [s.response["id"] for s in store._items.values()] and store.chars <= 2000
    store.put({"id": "huge"}, [{"role": "user", "content": "x" * 5000}])  # larger than the store: not kept
    with pytest.raises(ApiError):
        store.conversation("huge")
    now[0] = 61.0
    with pytest.raises(ApiError):
        store.conversation("big")
    assert len(store) == 0 and store.chars == 0


def test_a_client_gone_mid_stream_frees_the_request(node):
    assert_gone_mid_stream_frees(node, "/v1/responses", {"input": "Count to a thousand.",
                                                         "max_output_tokens": 4000, "temperature": 0,
                                                         "stream": True}, b"data:")


def test_an_openai_agents_sdk_agent_calls_its_tool_and_answers(tmp_path, default_model):
    """The Agents SDK's own loop over /v1/responses (streamed): a forced call of a Python function,
    its result sent back as a function_call_output, then the model's answer."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    set_tracing_disabled(True)
    asked = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"sunny, 24 C in {city}"

    with running_node(tmp_path) as node:
        client = openai.AsyncOpenAI(base_url=node.url + "/v1", api_key="none", max_retries=0, timeout=120)
        agent = Agent(name="weather", tools=[get_weather],
                      model=OpenAIResponsesModel(model="SmolLM2-135M-Instruct", openai_client=client),
                      model_settings=ModelSettings(tool_choice="required", max_tokens=120, temperature=0))
        result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert asked == ["Paris"]
    assert len(result.raw_responses) == 2 and isinstance(result.final_output, str) and result.final_output


def test_logprobs_are_chat_completions_own(client):
    want = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hello"}],
                                          max_tokens=6, temperature=0, logprobs=True,
                                          top_logprobs=3).choices[0].logprobs.content
    kwargs = dict(model="llama", input="hello", max_output_tokens=6, temperature=0, top_logprobs=3,
                  include=["message.output_text.logprobs"])
    got = client.responses.create(**kwargs).output[0].content[0].logprobs
    assert [(e.token, e.logprob, e.bytes) for e in got] == [(e.token, e.logprob, e.bytes) for e in want]
    assert [[t.token for t in e.top_logprobs] for e in got] == [[t.token for t in e.top_logprobs] for e in want]
    events = list(client.responses.create(stream=True, **kwargs))
    assert [e.token for ev in events if ev.type == "response.output_text.delta" for e in ev.logprobs] == \
        [e.token for e in want]
    assert client.responses.create(model="llama", input="hello", max_output_tokens=2).output[0].content[0].logprobs \
        == []
