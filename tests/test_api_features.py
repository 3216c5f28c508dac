"""What agents and apps build on, through the official openai client against real node processes:
tool calls, structured output, logprobs, penalties and logit bias, n choices, every request field
honoured or refused by name.

The tiny random-weight models say nothing sensible, which is the point: whatever they
would write, a forced tool call or a JSON schema holds, because the last stage only
lets through tokens that keep it.
"""

from __future__ import annotations

import json
import threading

import jsonschema
import openai
import pytest
from mlx_lm.utils import load_tokenizer
from model_zoo import TOOLS_CHAT_TEMPLATE
from helpers import openai_client, post_raw, streamed_answer
from node_process import running_node
from swarm.bench.cluster import get_json
from reference import reference_prompt_logprobs, reference_tokens, reference_with_penalties

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                   "properties": {"city": {"type": "string", "maxLength": 8},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "additionalProperties": False, "required": ["zone"],
                                       "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}}}}
TOOLS = [WEATHER, CLOCK]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 6}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_model(random_model):
    """A model whose chat template renders tools (Qwen 2.5's), <tool_call> being a token of its own."""
    return random_model("qwen2", seed=3, tools_template=True)


@pytest.fixture(scope="module")
def tools_node(tmp_path_factory, tools_model):
    with running_node(tmp_path_factory.mktemp("tools"), "--model", str(tools_model)) as n:
        yield n


def model_id(node) -> str:
    return get_json(node.url + "/v1/models")[1]["data"][0]["id"]


def assert_calls_follow_their_schemas(calls, tools=TOOLS) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


# -- tool calls ------------------------------------------------------------------------------------
@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"],
                         ids=["named", "required"])
def test_forced_tool_calls_hold_their_schema(client, choice):
    for seed in range(3):
        r = client.chat.completions.create(model="llama", messages=ASK, tools=TOOLS, tool_choice=choice,
                                           temperature=1.0, seed=seed, max_tokens=300)
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls", message
        assert message.content is None and len(message.tool_calls) == 1
        assert_calls_follow_their_schemas(message.tool_calls)
        if isinstance(choice, dict):
            assert message.tool_calls[0].function.name == "get_weather"


def test_a_streamed_tool_call_equals_the_whole_one(client):
    kwargs = dict(model="llama", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=300)
    whole = client.chat.completions.create(**kwargs).choices[0]
    got = streamed_answer(client.chat.completions.create(stream=True, **kwargs))
    [call] = got["calls"].values()
    assert got["finish"] == "tool_calls" and got["content"] == ""
    assert (call["name"], call["arguments"]) == (whole.message.tool_calls[0].function.name,
                                                 whole.message.tool_calls[0].function.arguments)


def test_several_forced_calls_when_parallel_calls_are_asked_for(client):
    r = client.chat.completions.create(model="llama", messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=True, max_tokens=400, logit_bias={"2": -100})
    # EOS banned: the model can only go on calling, until max_tokens cuts the last call off.
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "length"
    assert len(message.tool_calls) >= 2
    assert_calls_follow_their_schemas(message.tool_calls)
    assert message.content.startswith("<tool_call>\n{"), "the cut-off call comes back as text, not dropped"


def test_auto_with_a_template_that_renders_tools(tools_node, tools_model):
    """The model decides to call (pushed by the client's bias toward its <tool_call> token); from then on
    the call is held to the schema, parsed with mlx-lm's parser for this template, and returned as
    tool_calls. Without the push, it answers in text."""
    tok = load_tokenizer(tools_model)
    [start] = tok.encode("<tool_call>", add_special_tokens=False)
    client, mid = openai_client(tools_node.url), model_id(tools_node)
    for seed in range(2):
        r = client.chat.completions.create(model=mid, messages=ASK, tools=TOOLS, temperature=1.0, seed=seed,
                                           max_tokens=300, logit_bias={str(start): 100, "2": 50})
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0].message
        assert_calls_follow_their_schemas(r.choices[0].message.tool_calls)
    got = streamed_answer(client.chat.completions.create(model=mid, messages=ASK, tools=TOOLS, max_tokens=300,
                                                  logit_bias={str(start): 100, "2": 50}, stream=True))
    assert got["finish"] == "tool_calls" and len(got["calls"]) == 1
    plain = client.chat.completions.create(model=mid, messages=ASK, tools=TOOLS, max_tokens=20,
                                           logit_bias={str(start): -100})
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    assert plain.choices[0].finish_reason in ("stop", "length")


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "days": 1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Rome", "days": 1}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
]


def qwen_rendering(tokenizer, messages, tools) -> list[int]:
    """Qwen 2.5's own template on the conversation (arguments as objects, as its template wants)."""
    native = json.loads(json.dumps(messages))
    for m in native:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        m["content"] = m["content"] or ""
    return tokenizer.apply_chat_template(native, tools=tools, add_generation_prompt=True,
                                         chat_template=TOOLS_CHAT_TEMPLATE)


def test_past_calls_and_results_render_through_the_template(tools_node, tools_model):
    tok = load_tokenizer(tools_model)
    r = openai_client(tools_node.url).chat.completions.create(model=model_id(tools_node), messages=CONVERSATION,
                                                      tools=TOOLS, max_tokens=3)
    assert r.usage.prompt_tokens == len(qwen_rendering(tok, CONVERSATION, TOOLS))


def test_a_template_that_ignores_tools_gets_them_written_as_qwen_does(client, llama):
    """The tiny llama's template knows nothing of tools: the tools, the past calls and their results are
    written into the conversation as text, exactly as Qwen 2.5's template writes them."""
    tok = load_tokenizer(llama)
    r = client.chat.completions.create(model="llama", messages=CONVERSATION, tools=TOOLS, max_tokens=3)
    assert r.usage.prompt_tokens == len(qwen_rendering(tok, CONVERSATION, TOOLS))
    plain = client.chat.completions.create(model="llama", messages=CONVERSATION[:2], max_tokens=3)
    assert plain.usage.prompt_tokens == len(tok.apply_chat_template(CONVERSATION[:2], add_generation_prompt=True))


def test_tool_choice_none_offers_no_tools(client):
    r = client.chat.completions.create(model="llama", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=5)
    bare = client.chat.completions.create(model="llama", messages=ASK, max_tokens=5)
    assert r.usage.prompt_tokens == bare.usage.prompt_tokens and r.choices[0].message.tool_calls is None


# -- structured output -----------------------------------------------------------------------------
def test_json_schema_output_validates_even_from_a_random_model(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in range(4):
        r = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "A person?"}],
                                           response_format=fmt, temperature=1.0, seed=seed, max_tokens=300)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    got = streamed_answer(client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "Who?"}],
                                                  response_format=fmt, max_tokens=300, stream=True))
    jsonschema.validate(json.loads(got["content"]), PERSON)


def test_json_object_output_is_an_object(client):
    r = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "JSON please"}],
                                       response_format={"type": "json_object"}, max_tokens=400,
                                       logit_bias={"2": 5})  # a nudge toward EOS: free objects can go on long
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut off by max_tokens: still an object's beginning
        assert r.choices[0].message.content.startswith("{")


def test_a_schema_that_cannot_be_followed_is_a_400(node):
    for fmt in ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
                {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
                {"type": "xml"}):
        status, body = post_raw(node, "/v1/chat/completions",
                                json.dumps({"messages": ASK, "response_format": fmt}).encode())
        assert status == 400 and body["error"]["param"] == "response_format", body


# -- logprobs ---------------------------------------------------------------------------------------
def test_chat_logprobs_are_the_models_own_log_softmax(client, llama):
    tok = load_tokenizer(llama)
    r = client.chat.completions.create(model="llama", messages=ASK, logprobs=True, top_logprobs=4, max_tokens=16,
                                       temperature=0)
    expected = reference_tokens(llama, tok.apply_chat_template(ASK, add_generation_prompt=True), 16)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens - (r.choices[0].finish_reason == "stop")
    for entry, (token, lp) in zip(content, expected):
        assert bytes(entry.bytes) == tok.decode([token]).encode() or len(entry.bytes) == 1
        assert entry.logprob == pytest.approx(float(lp[token]), abs=1e-4)
        best = sorted(range(len(lp)), key=lambda t: -lp[t])[:4]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([float(lp[t]) for t in best], abs=1e-4)
    got = streamed_answer(client.chat.completions.create(model="llama", messages=ASK, logprobs=True, top_logprobs=4,
                                                  max_tokens=16, temperature=0, stream=True))
    assert [(e.token, round(e.logprob, 4)) for e in got["logprobs"]] == \
        [(e.token, round(e.logprob, 4)) for e in content]


def test_legacy_logprobs_and_echo(client, llama):
    tok = load_tokenizer(llama)
    prompt = "The quick brown fox jumps over the lazy dog."
    ids = tok.encode(prompt)
    r = client.completions.create(model="llama", prompt=prompt, echo=True, logprobs=3, max_tokens=6, temperature=0)
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(prompt)
    assert len(lp.tokens) == len(ids) + r.usage.completion_tokens - (r.choices[0].finish_reason == "stop")
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    rows = reference_prompt_logprobs(llama, ids)
    assert lp.token_logprobs[1:len(ids)] == pytest.approx([float(rows[q, ids[q + 1]]) for q in range(len(ids) - 1)],
                                                          abs=1e-4)
    assert all(len(top) >= 3 for top in lp.top_logprobs[1:])
    assert lp.text_offset[:2] == [0, len(tok.decode(ids[:1]))]
    plain = client.completions.create(model="llama", prompt=prompt, max_tokens=6, temperature=0)
    assert r.choices[0].text == prompt + plain.choices[0].text
    chunks = list(client.completions.create(model="llama", prompt=prompt, echo=True, logprobs=3, max_tokens=6,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[0].choices[0].logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:len(ids)],
                                                                              abs=1e-6)


# -- penalties, bias ---------------------------------------------------------------------------------
def test_penalties_and_logit_bias_change_what_they_should(client, llama):
    tok = load_tokenizer(llama)
    prompt = tok.apply_chat_template(ASK, add_generation_prompt=True)
    plain = client.chat.completions.create(model="llama", messages=ASK, max_tokens=24, temperature=0,
                                           logit_bias={"2": -100}).choices[0].message.content
    first = reference_tokens(llama, prompt, 1)[0][0]
    for kwargs, bias, presence, frequency in [
            ({"presence_penalty": 1.5}, {}, 1.5, 0.0), ({"frequency_penalty": 1.0}, {}, 0.0, 1.0),
            ({"logit_bias": {str(first): -100}}, {first: -100.0}, 0.0, 0.0)]:
        bias = {**bias, 2: -100.0}  # no early EOS: 24 tokens to compare
        lb = {**kwargs.pop("logit_bias", {}), "2": -100}
        got = client.chat.completions.create(model="llama", messages=ASK, max_tokens=24, temperature=0,
                                             logit_bias=lb, **kwargs).choices[0].message.content
        assert got == tok.decode(reference_with_penalties(llama, prompt, 24, bias, presence, frequency)), kwargs
        assert got != plain, kwargs


# -- n, models, defaults, bad input ---------------------------------------------------------------------
def test_n_choices_are_the_requests_with_seed_plus_i(client):
    kwargs = dict(model="llama", messages=ASK, temperature=1.0, max_tokens=12)
    r = client.chat.completions.create(n=3, seed=40, **kwargs)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.chat.completions.create(seed=40 + i, **kwargs) for i in range(3)]
    assert [c.message.content for c in r.choices] == [s.choices[0].message.content for s in singles]
    assert len({c.message.content for c in r.choices}) > 1
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    chunks = list(client.chat.completions.create(n=3, seed=40, stream=True, **kwargs))
    texts = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in range(3)}
    assert [texts[i] for i in range(3)] == [c.message.content for c in r.choices]


def test_models_retrieve(client):
    assert client.models.retrieve("llama").id == "llama"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_left_out_sampling_is_greedy_without_a_generation_config(client):
    greedy = client.chat.completions.create(model="llama", messages=ASK, max_tokens=16, temperature=0)
    for _ in range(2):
        assert client.chat.completions.create(model="llama", messages=ASK, max_tokens=16).choices[0].message.content \
            == greedy.choices[0].message.content


def test_a_message_without_content_is_a_400(client, node):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="llama", messages=[{"role": "user"}])
    for messages, param in [([{"role": "user"}], "messages[0].content"),
                            ([{"role": "user", "content": None}], "messages[0].content"),
                            ([{"role": "system", "content": "x"}, {"role": "assistant"}], "messages[1].content"),
                            ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id")]:
        status, body = post_raw(node, "/v1/chat/completions", json.dumps({"messages": messages}).encode())
        assert (status, body["error"]["param"]) == (400, param), body


# -- every request field: honoured or refused by name ------------------------------------------------------
CHAT_SAMPLES = {  # a value for each field this server honours (the rest of OpenAI's must be refused)
    "model": "llama", "messages": ASK, "max_tokens": 2, "max_completion_tokens": 2, "temperature": 0.5,
    "top_p": 0.9, "seed": 1, "stop": ["x"], "stream": False, "n": 2, "logprobs": True,
    "top_logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {"5": 1},
    "tools": TOOLS, "tool_choice": "none", "parallel_tool_calls": False, "response_format": {"type": "text"},
    "user": "u1", "safety_identifier": "s1", "prompt_cache_key": "k1", "prompt_cache_retention": "24h",
    "metadata": {"a": "b"}, "store": True, "service_tier": "flex", "modalities": ["text"],
    "reasoning_effort": "low", "verbosity": "low",
    "stream_options": {"include_usage": True},
}
COMPLETION_SAMPLES = {
    "model": "llama", "prompt": "hi", "max_tokens": 2, "temperature": 0.5, "top_p": 0.9, "seed": 1, "stop": "x",
    "stream": False, "n": 2, "best_of": 2, "logprobs": 2, "echo": True, "presence_penalty": 0.5,
    "frequency_penalty": 0.5, "logit_bias": {"5": 1}, "user": "u1", "suffix": "",
    "stream_options": {"include_usage": True},
}
NEEDS = {"top_logprobs": {"logprobs": True}, "stream_options": {"stream": True}, "best_of": {"n": 2}}


def openai_fields(params_module) -> set[str]:
    return set(params_module.CompletionCreateParamsBase.__annotations__) | {"stream"}


@pytest.mark.parametrize("path,fields,samples,base", [
    ("/v1/chat/completions", "chat", CHAT_SAMPLES, {"messages": ASK, "max_tokens": 2}),
    ("/v1/completions", "text", COMPLETION_SAMPLES, {"prompt": "hi", "max_tokens": 2})], ids=["chat", "completions"])
def test_every_openai_request_field_is_honoured_or_refused_by_name(node, path, fields, samples, base):
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_params
    every = openai_fields(chat_params if fields == "chat" else completion_create_params)
    assert set(samples) - {"modalities"} <= every | {"top_k", "repetition_penalty"}
    for field in sorted(every | {"frobnicate"}):
        if field in samples:
            body = {**base, **NEEDS.get(field, {}), field: samples[field]}
            status, reply = post_sse_or_json(node, path, body)
            assert status == 200, (field, reply)
        else:
            status, reply = post_raw(node, path, json.dumps({**base, field: {"x": 1}}).encode())
            assert (status, reply["error"]["param"]) == (400, field), (field, reply)
            assert field in reply["error"]["message"] or reply["error"]["code"] == "unsupported_parameter"
    for field, value in [("store", "yes"), ("service_tier", "turbo"), ("reasoning_effort", "max"),
                         ("modalities", ["text", "audio"])]:
        if field in every:
            status, reply = post_raw(node, path, json.dumps({**base, field: value}).encode())
            assert (status, reply["error"]["param"]) == (400, field), (field, reply)
    status, reply = post_raw(node, path, json.dumps({**base, "audio": None, "functions": None}).encode())
    assert status == 200, "a field sent as null counts as left out"


NO_EFFECT = {"reasoning_effort": "high", "verbosity": "low", "store": True, "metadata": {"app": "x"},
             "user": "u1", "service_tier": "priority"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_fields_without_effect_are_accepted_and_named_in_a_header_and_the_log(node, stream):
    """The fields some clients always send change nothing on a model that does not reason: the answer is
    the one without them, and the x-swarm-ignored header and the node's log name them."""
    import urllib.request
    base = {"messages": ASK, "max_tokens": 6, "temperature": 0, "stream": stream}
    answers, headers = [], []
    for body in (base, {**base, **NO_EFFECT, "parallel_tool_calls": True}):
        req = urllib.request.Request(node.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            answers.append(r.read().decode())
            headers.append(r.headers.get("x-swarm-ignored"))
    assert headers[0] is None, "nothing ignored, no header"
    assert sorted(headers[1].split(", ")) == sorted(NO_EFFECT), headers[1]  # parallel_tool_calls is applied
    if stream:
        texts = ["".join((json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                         for line in a.splitlines() if line.startswith("data: {")) for a in answers]
    else:
        texts = [json.loads(a)["choices"][0]["message"]["content"] for a in answers]
    assert texts[0] == texts[1]
    assert "accepted and ignored" in node.log.read_text() and "reasoning_effort" in node.log.read_text()


def post_sse_or_json(node, path: str, body: dict) -> tuple[int, object]:
    if not body.get("stream"):
        return post_raw(node, path, json.dumps(body).encode())
    import urllib.request
    req = urllib.request.Request(node.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read().decode()


# -- batched decode ------------------------------------------------------------------------------------
def test_batched_decode_applies_each_requests_rules(tmp_path, llama):
    with running_node(tmp_path, "--model", str(llama), "--batch-decode", "4") as node:
        client = openai_client(node.url)
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        results: dict = {}

        def ask(name: str, **kwargs) -> None:
            results[name] = client.chat.completions.create(model="llama", messages=ASK, **kwargs)

        asks = {"schema": dict(response_format=fmt, max_tokens=300),
                "tool": dict(tools=TOOLS, tool_choice="required", max_tokens=300),
                "logprobs": dict(logprobs=True, top_logprobs=2, max_tokens=120, logit_bias={"2": -100}),
                "plain": dict(max_tokens=120, logit_bias={"2": -100})}
        for _ in range(3):  # until the steps of different requests met in one pass
            threads = [threading.Thread(target=ask, args=(k,), kwargs=v) for k, v in asks.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if node.health()[1]["decode_batching"]["batched_passes"] > 0:
                break
        assert node.health()[1]["decode_batching"]["batched_passes"] > 0
        jsonschema.validate(json.loads(results["schema"].choices[0].message.content), PERSON)
        assert_calls_follow_their_schemas(results["tool"].choices[0].message.tool_calls)
        assert len(results["logprobs"].choices[0].logprobs.content) == 120
        assert results["plain"].usage.completion_tokens == 120
