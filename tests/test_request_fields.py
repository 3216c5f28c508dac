"""The one list every API face checks its fields against: applied, accepted without effect (and
reported), or refused by name; a reasoning effort only means nothing to a model that does not reason."""

from __future__ import annotations

import pytest

from swarm.api.anthropic_request import parse_messages_request
from swarm.api.errors import ApiError
from swarm.api.request_fields import CHAT_FIELDS, check_fields

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
