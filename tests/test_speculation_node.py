"""Speculative decoding in one real node process (its entry, its stage, its data lane), through the official
openai client: the same greedy text, token ids and logprobs with drafts as without, the same seeded sampled
text, a grammar request drafts nothing, n > 1, a stop string crossed by drafts; /health counts the drafts."""

from __future__ import annotations

import json

import openai
import pytest

from reference import reference_chat

# A prompt whose answer tends to repeat what came before: lookup finds drafts on the random test model.
PROMPT = "one two three four five six seven eight one two three four five six seven eight one two three"
SHORT = "one two three four five six seven eight one two three"
MESSAGES = [{"role": "user", "content": PROMPT}]


def spec_counts(node) -> dict:
    status, body = node.health()
    assert status == 200
    return body["speculation"]


def ask(client, speculate: bool, prompt: str = PROMPT, **kwargs):
    return client.completions.create(model="llama", prompt=prompt, extra_body={"speculate": speculate,
                                                                               "return_token_ids": True}, **kwargs)


def test_greedy_text_ids_and_logprobs_are_the_same_with_drafts(node, client, llama):
    before = spec_counts(node)
    assert before["mode"] == "lookup"
    # (the random test model repeats itself in this answer: lookup finds drafts, and some are accepted)
    on = ask(client, True, SHORT, max_tokens=40, temperature=0)
    mid = spec_counts(node)
    off = ask(client, False, SHORT, max_tokens=40, temperature=0)
    assert spec_counts(node)["drafts_proposed"] == mid["drafts_proposed"], "speculate: false drafts nothing"
    assert mid["drafts_proposed"] > before["drafts_proposed"] and mid["drafts_accepted"] > before["drafts_accepted"]
    assert on.choices[0].token_ids == off.choices[0].token_ids and on.choices[0].text == off.choices[0].text

    a, b = (ask(client, s, SHORT, max_tokens=40, temperature=0, logprobs=2).choices[0] for s in (True, False))
    assert a.token_ids == b.token_ids and a.logprobs.tokens == b.logprobs.tokens
    assert max(abs(x - y) for x, y in zip(a.logprobs.token_logprobs, b.logprobs.token_logprobs)) < 1e-4
    assert spec_counts(node)["drafts_proposed"] > mid["drafts_proposed"], "logprobs requests draft too"
    chat_on = client.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=30, temperature=0)
    text, _ = reference_chat(llama, MESSAGES, 30)
    assert chat_on.choices[0].message.content == text, "mlx-lm's greedy text"


def test_seeded_sampling_n_and_stop_strings_with_drafts(node, client):
    kwargs = dict(max_tokens=32, temperature=0.7, top_p=0.95, seed=11)
    assert ask(client, True, **kwargs).choices[0].text == ask(client, False, **kwargs).choices[0].text
    two = ask(client, True, n=2, max_tokens=24, temperature=0)
    one = ask(client, False, max_tokens=24, temperature=0)
    assert [c.text for c in two.choices] == [one.choices[0].text] * 2
    text = one.choices[0].text
    stop = text[6:9]
    cut = ask(client, True, max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[:text.find(stop)] and cut.choices[0].finish_reason == "stop"


def test_a_grammar_request_drafts_nothing_and_a_bad_field_is_refused(node, client):
    before = spec_counts(node)["drafts_proposed"]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = client.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=24, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": schema}})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content)["a"], int)
    assert spec_counts(node)["drafts_proposed"] == before
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="llama", prompt="x", max_tokens=2, extra_body={"speculate": "yes"})
    assert "speculate" in str(e.value)
