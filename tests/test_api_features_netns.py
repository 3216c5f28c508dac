"""A tool call, a JSON schema answer and logprobs through a kill -9 of a stage mid-stream, on separate hosts.

Three `swarm-node` processes on network-namespace hosts serve the default model; the
official openai client streams from the entry. Mid-answer a stage is killed: once the
last stage itself, where the grammar, the penalties' counts and the logprobs live, once
the middle one. The survivors re-plan, the entry replays the request's history through
the new pipeline, the new last stage rebuilds the request's sampler from it, and the
client gets exactly the undisturbed answer: the same call, the same JSON, the same
logprobs (to float rounding: a replay prefills what the first run decoded step by step).
"""

from __future__ import annotations

import json
import threading
import time

import jsonschema
import pytest
from helpers import openai_client, streamed_answer
from netns import netns_unavailable_reason
from netns_client import in_netns

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather and a forecast for a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "days", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 30},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 14},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "hobbies"],
          "properties": {"name": {"type": "string", "maxLength": 30},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"type": "string", "maxLength": 30},
                         "hobbies": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 20}}}}
ASKS = {
    "tool_call": dict(messages=[{"role": "user", "content": "What will the weather be in Paris this week?"}],
                      tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                      max_tokens=120, logprobs=True, top_logprobs=3, temperature=0),
    "json_schema": dict(messages=[{"role": "user", "content": "Invent a person who lives in Lisbon."}],
                        response_format={"type": "json_schema",
                                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
                        max_tokens=160, logprobs=True, top_logprobs=3, temperature=0.7, seed=11,
                        frequency_penalty=0.3),
}


class OpenAIStream:
    """A streaming chat request by the openai client, from inside the entry's host, in the background."""

    def __init__(self, node, ask: dict):
        self.chunks: list = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(node, ask), daemon=True)
        self.thread.start()

    def _run(self, node, ask: dict) -> None:
        def consume():
            client = openai_client(node.url, timeout=300)
            for chunk in client.chat.completions.create(model="SmolLM2-135M-Instruct", stream=True, **ask):
                self.chunks.append((time.monotonic(), chunk))
        try:
            in_netns(node.host.ns, consume)
        except BaseException as e:  # handed to the test
            self.error = e

    def finish(self, timeout: float = 300) -> dict:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the stream did not finish"
        assert self.error is None, repr(self.error)
        return streamed_answer(c for _, c in self.chunks)


def generated(node) -> int:
    """Tokens this entry has generated so far (its /health counter)."""
    return node.get("/health")[1]["total_tokens"]


@pytest.fixture(scope="module")
def swarm(default_swarm):
    return default_swarm


def check_valid(kind: str, answer: dict) -> None:
    if kind == "tool_call":
        [call] = answer["calls"].values()
        assert answer["finish"] == "tool_calls" and call["name"] == "get_weather", answer
        jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])
    else:
        assert answer["finish"] == "stop", answer
        jsonschema.validate(json.loads(answer["content"]), PERSON)


# Each kind once, and each place a constraint can break: the stage that samples (last) and one
# before it (middle). A third case (json_schema, last) added a minute to the suite and nothing new.
@pytest.mark.parametrize("kind,victim", [("tool_call", 2), ("json_schema", 1)],
                         ids=["tool_call-last_stage", "json_schema-middle_stage"])
def test_a_constrained_stream_goes_on_through_a_kill_9_unchanged(swarm, kind, victim):
    swarm.restore()  # (the case before left its victim starting again)
    entry, doomed = swarm.nodes[0], swarm.nodes[victim]
    undisturbed = OpenAIStream(entry, ASKS[kind]).finish()
    check_valid(kind, undisturbed)
    n_tokens = len(undisturbed["logprobs"])
    assert n_tokens > 12, "long enough to be killed in the middle of"

    replays = entry.proc.logs(10_000).count("replaying")
    before = generated(entry)
    stream = OpenAIStream(entry, ASKS[kind])
    deadline = time.monotonic() + 120
    while generated(entry) - before < 4:  # the answer is under way (a tool call streams only when whole)
        assert time.monotonic() < deadline and stream.thread.is_alive(), "the stream did not start"
        time.sleep(0.02)
    doomed.proc.kill9()
    at_kill = generated(entry) - before
    answer = stream.finish()
    assert at_kill + 3 <= n_tokens, f"the kill came too late to test anything ({at_kill} of {n_tokens} tokens)"
    assert entry.proc.logs(10_000).count("replaying") > replays, "the entry replayed the request"
    print(f"{kind}: killed node{victim} after {at_kill} of {n_tokens} tokens")

    check_valid(kind, answer)
    assert (answer["content"], answer["finish"]) == (undisturbed["content"], undisturbed["finish"])
    assert [(c["name"], c["arguments"]) for c in answer["calls"].values()] == \
        [(c["name"], c["arguments"]) for c in undisturbed["calls"].values()]
    assert [e.token for e in answer["logprobs"]] == [e.token for e in undisturbed["logprobs"]]
    for got, want in zip(answer["logprobs"], undisturbed["logprobs"]):
        assert got.logprob == pytest.approx(want.logprob, abs=2e-3)
        assert [t.token for t in got.top_logprobs][:1] == [t.token for t in want.top_logprobs][:1]

    doomed.start()  # serving again by the next test's restore: no test left waits for it after the last
