"""Ollama's API on one real node (tiny random-weight models), driven by the official `ollama` client.

Chat and generate answer as chat completions does for the same messages, streamed as NDJSON
by default; options, format and tools go through the shared parsers and grammars; tags, show,
ps and version describe the swarm's model; every bad body is a 4xx `{"error": "..."}` and the
node keeps serving.
"""

from __future__ import annotations

import json
import urllib.request

import jsonschema
import ollama
import openai
import pytest
from helpers import assert_gone_mid_stream_frees
from node_process import running_node

# What the ollama client sends of a tool: its Tool model keeps type, properties, required (not
# additionalProperties), so this is the schema a call can be held to.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"enum": ["Paris", "Rome"]}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# The tiny llama's greedy answer to this runs past 1,000 tokens: a stream that outlasts a client.
LONG_ASK = [{"role": "user", "content": "Count to a thousand."}]
GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture
def ollama_client(node):
    """The official ollama client, for conftest's node (the tiny llama)."""
    return ollama.Client(host=node.url, timeout=120)


def chat_completion(node, messages: list[dict], max_tokens: int = 12) -> str:
    oc = openai.OpenAI(base_url=node.url + "/v1", api_key="none", max_retries=0, timeout=120)
    return oc.chat.completions.create(model="llama", messages=messages, max_tokens=max_tokens,
                                      temperature=0).choices[0].message.content


def post(node, path: str, body: bytes | dict) -> tuple[int, bytes, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(node.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def test_greedy_chat_and_generate_equal_chat_completions(node, ollama_client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    want = chat_completion(node, messages)
    r = ollama_client.chat(model="llama", messages=messages, options=GREEDY)
    assert r.message.content == want and r.message.role == "assistant"
    assert r.done and r.done_reason == "length" and r.eval_count == 12 and r.prompt_eval_count > 3
    assert r.total_duration >= r.eval_duration > 0
    streamed = list(ollama_client.chat(model="llama", messages=messages, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in streamed) == want
    assert [p.done for p in streamed] == [False] * (len(streamed) - 1) + [True]
    g = ollama_client.generate(model="llama", system="Be brief.", prompt="hello", options=GREEDY)
    assert g.response == want and g.done_reason == "length"
    pieces = list(ollama_client.generate(model="llama", system="Be brief.", prompt="hello", options=GREEDY,
                                         stream=True))
    assert "".join(p.response for p in pieces) == want


def test_streaming_is_the_default_as_ollama_does(node):
    status, raw, headers = post(node, "/api/chat", {"model": "llama", "messages": ASK, "options": GREEDY})
    assert status == 200 and headers["Content-Type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in raw.splitlines()]
    assert len(lines) > 2 and lines[-1]["done"] is True and not any(x["done"] for x in lines[:-1])
    status, raw, _ = post(node, "/api/generate", {"model": "llama", "prompt": "hi", "stream": False,
                                                  "options": GREEDY})
    assert status == 200 and json.loads(raw)["done"] is True


def test_raw_generate_is_the_completions_prompt(node, ollama_client):
    oc = openai.OpenAI(base_url=node.url + "/v1", api_key="none", max_retries=0, timeout=120)
    want = oc.completions.create(model="llama", prompt="Once upon", max_tokens=12, temperature=0).choices[0].text
    assert ollama_client.generate(model="llama", prompt="Once upon", raw=True, options=GREEDY).response == want


def test_options_apply(ollama_client):
    base = ollama_client.generate(model="llama", prompt="abc", options=GREEDY).response
    stop = base[3:5]
    cut = ollama_client.generate(model="llama", prompt="abc", options={**GREEDY, "stop": [stop]})
    assert cut.response == base[:base.find(stop)] and cut.done_reason == "stop"
    sampled = dict(temperature=1.0, top_p=0.9, top_k=40, num_predict=12)
    a = ollama_client.generate(model="llama", prompt="x", options={**sampled, "seed": 7}).response
    assert ollama_client.generate(model="llama", prompt="x", options={**sampled, "seed": 7}).response == a
    assert ollama_client.generate(model="llama", prompt="x", options={**sampled, "seed": 8}).response != a
    assert ollama_client.generate(model="llama", prompt="x", options={"num_predict": 3}).eval_count == 3


def test_format_json_and_a_schema(ollama_client):
    person = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
              "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"}}}
    r = ollama_client.chat(model="llama", messages=[{"role": "user", "content": "a person"}], format=person,
                           options={"temperature": 0.8, "seed": 1, "num_predict": 100})
    assert r.done_reason == "stop", r
    jsonschema.validate(json.loads(r.message.content), person)
    r = ollama_client.generate(model="llama", prompt="json", format="json",
                               options={"temperature": 0, "num_predict": 60})
    assert r.response.startswith("{")


def test_tags_show_ps_version_and_names(node, ollama_client):
    [model] = ollama_client.list().models
    assert model.model == "llama:latest" and model.size > 0 and model.digest
    assert model.details.family == "llama" and model.details.parameter_size.endswith("K")
    shown = ollama_client.show("llama")
    assert shown.details.family == "llama" and "tools" in shown.capabilities
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.block_count"] == 6
    assert shown.modelinfo["llama.context_length"] > 0 and shown.template
    [running] = ollama_client.ps().models
    assert running.model == "llama:latest" and running.context_length > 0
    status, raw, _ = post(node, "/api/version", b"")  # a POST: not a route
    assert status == 405 and "error" in json.loads(raw)
    assert json.loads(urllib.request.urlopen(node.url + "/api/version").read())["version"]
    for name in ("llama", "llama:latest", "LLAMA", "Llama:Latest"):
        assert ollama_client.chat(model=name, messages=ASK, options={"num_predict": 1}).done
    for name in ("llama:7b", "mistral", "llam"):
        with pytest.raises(ollama.ResponseError) as e:
            ollama_client.chat(model=name, messages=ASK)
        assert e.value.status_code == 404 and name in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        ollama_client.show("mistral")
    assert e.value.status_code == 404


def test_an_empty_request_loads_the_model(ollama_client):
    assert ollama_client.generate(model="llama").done_reason == "load"
    assert ollama_client.chat(model="llama", messages=[]).done_reason == "load"


def test_fields_that_change_nothing_are_accepted_and_named(node):
    status, raw, headers = post(node, "/api/chat", {
        "model": "llama", "messages": ASK, "stream": False, "keep_alive": "5m", "think": False,
        "options": {"num_predict": 2, "num_ctx": 4096, "num_thread": 2, "mirostat": 0}})
    assert status == 200, raw
    assert headers["x-swarm-ignored"].split(", ") == ["keep_alive", "options.num_ctx", "options.num_thread",
                                                      "options.mirostat"]
    assert "POST /api/chat: accepted and ignored (nothing here changes with them): keep_alive" in node.log.read_text()


@pytest.fixture(scope="module")
def tools_node(tmp_path_factory, random_model):
    """A model whose chat template renders tools (Qwen 2.5's), <tool_call> being a token of its own."""
    model = random_model("qwen2", seed=3, tools_template=True)
    with running_node(tmp_path_factory.mktemp("ollama-tools"), "--model", str(model)) as n:
        yield n


def a_tool_call(client: ollama.Client, messages: list[dict], stream: bool = False) -> tuple[int, list]:
    """Ollama has no tool_choice: the model decides. A random model calls now and then when it samples;
    the first seed whose answer holds a call (there is one among the first few, and which is fixed)."""
    for seed in range(16):
        options = {"temperature": 1.0, "seed": seed, "num_predict": 200}
        if stream:
            calls = [c for part in client.chat(model="qwen2", messages=messages, tools=[WEATHER], options=options,
                                               stream=True) for c in part.message.tool_calls or []]
        else:
            calls = client.chat(model="qwen2", messages=messages, tools=[WEATHER], options=options).message.tool_calls
        if calls:
            return seed, calls
    raise AssertionError("no tool call in 16 seeds")


def test_a_tool_call_and_its_result(tools_node):
    client = ollama.Client(host=tools_node.url, timeout=120)
    seed, calls = a_tool_call(client, ASK)
    assert a_tool_call(client, ASK, stream=True)[0] == seed
    for call in calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(dict(call.function.arguments), WEATHER["function"]["parameters"])
    # The call and its result sent back, as the client's own objects: the model answers on.
    messages = [*ASK, {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_name": "get_weather", "content": "sunny"}]
    answer = client.chat(model="qwen2", messages=messages, tools=[WEATHER], options={"temperature": 0,
                                                                                   "num_predict": 5})
    assert answer.done and answer.prompt_eval_count > 0


OK = {"model": "llama", "messages": ASK, "stream": False}
GEN = {"model": "llama", "prompt": "hi", "stream": False}
BAD_BODIES = [
    ("/api/chat", b"{not json", 400),
    ("/api/chat", b"[1, 2]", 400),
    ("/api/chat", {"messages": ASK}, 400),
    ("/api/chat", {**OK, "model": 5}, 400),
    ("/api/chat", {**OK, "model": "gpt-9"}, 404),
    ("/api/chat", {**OK, "messages": "hi"}, 400),
    ("/api/chat", {**OK, "messages": [{"role": "wizard", "content": "x"}]}, 400),
    ("/api/chat", {**OK, "messages": [{"role": "user", "content": 5}]}, 400),
    ("/api/chat", {**OK, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400),
    ("/api/chat", {**OK, "messages": [{"role": "user", "content": "x\ud800"}]}, 400),
    ("/api/chat", {**OK, "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}]}, 400),
    ("/api/chat", {**OK, "tools": [{"type": "retrieval"}]}, 400),
    ("/api/chat", {**OK, "tools": "all"}, 400),
    ("/api/chat", {**OK, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a\udfff": {"type": "string"}}}}}]}, 400),
    ("/api/chat", {**OK, "format": "yaml"}, 400),
    ("/api/chat", {**OK, "format": "json", "tools": [WEATHER]}, 400),
    ("/api/chat", {**OK, "format": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}, 400),
    ("/api/chat", {**OK, "options": "hot"}, 400),
    ("/api/chat", {**OK, "options": {"temperature": "hot"}}, 400),
    ("/api/chat", {**OK, "options": {"num_predict": 0}}, 400),
    ("/api/chat", {**OK, "options": {"num_predict": 10**9}}, 400),
    ("/api/chat", {**OK, "options": {"top_p": 2}}, 400),
    ("/api/chat", {**OK, "options": {"stop": 5}}, 400),
    ("/api/chat", {**OK, "options": {"mirostat": 2}}, 400),
    ("/api/chat", {**OK, "options": {"typical_p": 0.5}}, 400),
    ("/api/chat", {**OK, "stream": "yes"}, 400),
    ("/api/chat", {**OK, "think": True}, 400),
    ("/api/chat", {**OK, "logprobs": "yes"}, 400),
    ("/api/chat", {**OK, "logprobs": True, "top_logprobs": 50}, 400),
    ("/api/generate", {**GEN, "top_logprobs": 2}, 400),
    ("/api/chat", {**OK, "keep_alive": [1]}, 400),
    ("/api/chat", {**OK, "frobnicate": 1}, 400),
    ("/api/generate", {**GEN, "prompt": 5}, 400),
    ("/api/generate", {**GEN, "suffix": "end"}, 400),
    ("/api/generate", {**GEN, "template": "{{ .Prompt }}"}, 400),
    ("/api/generate", {**GEN, "context": [1, 2, 3]}, 400),
    ("/api/generate", {**GEN, "images": ["aGk="]}, 400),
    ("/api/generate", {**GEN, "raw": True, "system": "x"}, 400),
    ("/api/generate", {**GEN, "prompt": "word " * 200_000}, 400),
    ("/api/show", {}, 400),
    ("/api/show", {"model": "gpt-9"}, 404),
    ("/api/nothing", {}, 404),
]


@pytest.mark.parametrize("path,body,status", BAD_BODIES)
def test_bad_bodies_get_ollama_errors(node, path, body, status):
    got, raw, _ = post(node, path, body)
    assert got == status, raw
    payload = json.loads(raw)
    assert list(payload) == ["error"] and isinstance(payload["error"], str) and payload["error"], payload


def test_the_node_keeps_serving_after_bad_bodies(node, ollama_client):
    for path, body, _ in BAD_BODIES:
        post(node, path, body)
    status, raw, _ = post(node, "/api/chat", b'{"x": "' + b"a" * (5 * 1024 * 1024) + b'"}')
    assert status == 413 and json.loads(raw)["error"]
    assert ollama_client.chat(model="llama", messages=ASK, options={"num_predict": 2}).done
    assert node.health()[0] == 200


def test_a_client_gone_mid_stream_frees_the_request(node):
    assert_gone_mid_stream_frees(node, "/api/chat", {"model": "llama", "messages": LONG_ASK,
                                                     "options": {"num_predict": 4000, "temperature": 0}},
                                 b'"done":false')


def test_logprobs_are_chat_completions_own(node, ollama_client):
    messages = [{"role": "user", "content": "hello"}]
    oc = openai.OpenAI(base_url=node.url + "/v1", api_key="none", max_retries=0, timeout=120)
    want = oc.chat.completions.create(model="llama", messages=messages, max_tokens=6, temperature=0, logprobs=True,
                                      top_logprobs=3).choices[0].logprobs.content
    r = ollama_client.chat(model="llama", messages=messages, options={"temperature": 0, "num_predict": 6},
                           logprobs=True, top_logprobs=3)
    assert [(e.token, e.logprob) for e in r.logprobs] == [(e.token, e.logprob) for e in want]
    assert [[t.token for t in e.top_logprobs] for e in r.logprobs] == [[t.token for t in e.top_logprobs]
                                                                        for e in want]
    parts = list(ollama_client.generate(model="llama", prompt="hello", options={"temperature": 0, "num_predict": 6},
                                        logprobs=True, stream=True))
    assert [e.token for p in parts for e in p.logprobs or []] == [e.token for e in want]
    assert ollama_client.chat(model="llama", messages=messages, options={"num_predict": 2}).logprobs is None
