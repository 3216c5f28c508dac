"""The one list every API face checks its fields against: applied, accepted without effect (and
reported), or refused by name; a reasoning effort only means nothing to a model that does not reason."""

from __future__ import annotations

import pytest

from swarm.api.anthropic_request import parse_messages_request
from swarm.api.errors import ApiError
from swarm.api.ollama_body import parse_chat_body, parse_generate_body
from swarm.api.request_fields import CHAT_FIELDS, check_fields
from swarm.api.request_parsing import parse_params
from swarm.api.responses_body import parse_responses_body
from swarm.models.generation_defaults import GenerationDefaults

ASK = [{"role": "user", "content": "hi"}]


def test_fields_without_effect_are_returned_in_order_and_applied_ones_are_not():
    body = {"messages": ASK, "temperature": 0, "store": True, "user": "u", "parallel_tool_calls": True,
            "reasoning_effort": "low", "verbosity": "high", "service_tier": "flex", "metadata": None}
    assert check_fields(body, CHAT_FIELDS) == ["store", "user", "reasoning_effort", "verbosity", "service_tier"]


@pytest.mark.parametrize("field,value", [("store", "yes"), ("user", 5), ("metadata", {"a": 1}),
                                         ("service_tier", "turbo"), ("reasoning_effort", "max"),
                                         ("verbosity", 3), ("frobnicate", 1)])
def test_a_field_without_effect_is_still_checked(field, value):
    with pytest.raises(ApiError) as caught:
        check_fields({"messages": ASK, field: value}, CHAT_FIELDS)
    assert caught.value.status == 400 and caught.value.param == field


@pytest.mark.parametrize("field", ["reasoning_effort", "verbosity"])
def test_a_model_that_reasons_refuses_a_reasoning_effort_by_name(field):
    value = "low"
    assert check_fields({field: value}, CHAT_FIELDS, reasoning=False) == [field]
    with pytest.raises(ApiError) as caught:
        check_fields({field: value}, CHAT_FIELDS, reasoning=True)
    assert caught.value.param == field and "reasons" in caught.value.message


def test_anthropic_thinking_and_effort_are_ignored_only_without_reasoning():
    body = {"max_tokens": 4, "messages": ASK, "thinking": {"type": "disabled"}, "output_config": {"effort": "low"},
            "metadata": {"user_id": "u-1"}}
    assert sorted(parse_messages_request(body, reasoning=False).ignored) == \
        ["metadata", "output_config.effort", "thinking"]
    for key in ("thinking", "output_config"):
        with pytest.raises(ApiError) as caught:
            parse_messages_request({"max_tokens": 4, "messages": ASK, key: body[key]}, reasoning=True)
        assert caught.value.param == key


def test_anthropic_messages_become_the_chat_form():
    request = parse_messages_request({"max_tokens": 4, "system": [{"type": "text", "text": "Be brief."}], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "text", "text": "Thanks"}]}]}, reasoning=False)
    assert request.messages == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": '{"c": "P"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}, {"role": "user", "content": "Thanks"}]


def test_a_face_adds_its_own_fields_without_effect():
    def keep_alive(name, value):
        return None if isinstance(value, (int, str)) else f"'{name}' must be a duration"
    allowed = {"model", "keep_alive", "user"}
    assert check_fields({"keep_alive": "5m", "user": "u"}, allowed, no_effect={"keep_alive": keep_alive}) == \
        ["keep_alive", "user"]
    with pytest.raises(ApiError) as caught:
        check_fields({"keep_alive": [1]}, allowed, no_effect={"keep_alive": keep_alive})
    assert caught.value.param == "keep_alive" and "duration" in caught.value.message


def test_a_face_names_its_own_refusals_limits_and_the_fields_it_applies():
    allowed = {"model", "store", "metadata", "background"}
    applied = frozenset({"store", "metadata"})
    body = {"model": "m", "store": False, "metadata": {"a": "b"}, "background": False}
    assert check_fields(body, allowed, no_effect={"background": lambda name, value: None},
                        only={"background": ({False}, "no background")}, applied=applied) == ["background"]
    with pytest.raises(ApiError) as caught:
        check_fields({"background": True}, allowed, only={"background": ({False}, "no background")})
    assert (caught.value.param, caught.value.message, caught.value.code) == \
        ("background", "no background", "unsupported_parameter")
    with pytest.raises(ApiError) as caught:
        check_fields({"conversation": "c"}, allowed, why_not={"conversation": "not stored here"})
    assert (caught.value.param, caught.value.message) == ("conversation", "not stored here")


def test_an_empty_list_or_object_asks_for_nothing_and_is_not_named():
    assert check_fields({"messages": ASK, "metadata": {}, "user": ""}, CHAT_FIELDS) == ["user"]


def params_of(chat: dict):
    return parse_params(chat, 4096, 1000, GenerationDefaults(), chat=True)


def test_responses_and_ollama_check_their_fields_with_the_shared_list():
    request = parse_responses_body({"input": "hi", "store": False, "metadata": {"a": "b"}, "reasoning": {},
                                    "user": "u", "truncation": "auto", "background": False}, params_of)
    assert request.ignored == ["user", "truncation", "background"] and request.store is False
    for bad, field in (({"background": True}, "background"), ({"truncation": "middle"}, "truncation"),
                       ({"max_tool_calls": True}, "max_tool_calls"), ({"conversation": "c"}, "conversation")):
        with pytest.raises(ApiError) as caught:
            parse_responses_body({"input": "hi", **bad}, params_of)
        assert caught.value.param == field
    request = parse_chat_body({"model": "m", "messages": ASK, "keep_alive": 0, "options": {"mirostat": 0.0}},
                              params_of)
    assert request.ignored == ["keep_alive", "options.mirostat"]
    chat, generate = {"model": "m", "messages": ASK}, {"model": "m", "prompt": "hi"}
    for parse, body, field in ((parse_chat_body, {**chat, "keep_alive": True}, "keep_alive"),
                               (parse_chat_body, {**chat, "options": {"mirostat": False}}, "options.mirostat"),
                               (parse_chat_body, {**chat, "user": "u"}, "user"),
                               (parse_generate_body, {**generate, "suffix": "end"}, "suffix")):
        with pytest.raises(ApiError) as caught:
            parse(body, params_of)
        assert caught.value.param == field
    assert "fill-in-the-middle" in caught.value.message
