"""Drafts across 3 real hosts (the default model split 3 ways, tests/swarm_cluster.py): an answer that copies
its input is accepted in several tokens a pass, and the text is mlx-lm's greedy text with and without drafts;
/health counts the drafts."""

from __future__ import annotations

import pytest
from helpers import chat_body
from netns import netns_unavailable_reason
from reference import reference_chat

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

# copy-and-fix: most of the answer continues a 3-gram of the prompt
TYPOS = ("Fix the spelling in this paragraph and write it out again: The quik brown fox jumpd over the lazy "
         "dog. It was a sunny day and the birds were singng in the trees.")


def test_an_answer_that_quotes_its_input_is_accepted_in_several_tokens_a_pass(default_swarm, default_model):
    node = default_swarm.nodes[0]
    body = chat_body(TYPOS, 40)
    expected, n_tokens = reference_chat(default_model.path, body["messages"], 40)
    _, before = node.get("/health")
    status, reply = node.post("/v1/chat/completions", body)
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"] == expected
    assert reply["usage"]["completion_tokens"] == n_tokens
    _, after = node.get("/health")
    spec, was = after["speculation"], before["speculation"]
    assert spec["on"] and spec["drafts_accepted"] - was["drafts_accepted"] >= n_tokens // 4, (was, spec)
    status, plain = node.post("/v1/chat/completions", {**body, "speculate": False})
    assert status == 200 and plain["choices"][0]["message"]["content"] == expected
    _, last = node.get("/health")
    assert last["speculation"]["drafts_proposed"] == spec["drafts_proposed"]  # none for that request


def test_sampled_choices_logprobs_and_grammars_give_the_same_answers_with_drafts(default_swarm):
    node = default_swarm.nodes[1]
    seeded = {**chat_body(TYPOS, 24), "temperature": 0.8, "seed": 11, "n": 2}
    with_logprobs = {**chat_body(TYPOS, 16), "logprobs": True, "top_logprobs": 2}
    schema = {"type": "object", "properties": {"fixed": {"type": "string"}}, "required": ["fixed"]}
    grammar = {**chat_body(TYPOS, 24), "response_format": {"type": "json_schema",
                                                           "json_schema": {"name": "fix", "schema": schema}}}
    for body in (seeded, with_logprobs, grammar):
        _, before = node.get("/health")
        status, on = node.post("/v1/chat/completions", body)
        assert status == 200, on
        _, after = node.get("/health")
        status, off = node.post("/v1/chat/completions", {**body, "speculate": False})
        assert status == 200, off
        assert [c["message"]["content"] for c in on["choices"]] == [c["message"]["content"] for c in off["choices"]]
        assert [c.get("logprobs") for c in on["choices"]] == [c.get("logprobs") for c in off["choices"]]
        if body is not seeded:  # a request with decoding rules checks one token a step: no drafts
            assert after["speculation"]["drafts_proposed"] == before["speculation"]["drafts_proposed"]
