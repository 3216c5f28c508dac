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
