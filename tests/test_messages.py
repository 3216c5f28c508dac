"""Typed peer messages (transport/messages.py): every field checked once, where frames come in."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from swarm.engine.decoding_rules import DecodingRules
from swarm.engine.sampling import SamplingParams
from swarm.engine.token_logprobs import TokenLogprobs
from swarm.transport.arrays import encode_array
from swarm.transport.errors import ProtocolError
from swarm.transport.frames import Frame, FrameParser, encode_frame
from swarm.transport.handshake_messages import Hello, Rejection
from swarm.transport.messages import MAX_KEEP_IDS, Error, Forward, Release, Token, decode
from swarm.transport.ping_messages import MAX_QUIET_US, Ping, Pong

SAMPLING = SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=2**64 - 1)


def on_the_wire(message) -> Frame:
    """What the receiving lane parses: the message encoded, framed and read back."""
    [frame] = FrameParser().feed(b"".join(bytes(p) for p in encode_frame(*message.to_frame())))
    return frame


def tokens_in() -> Forward:
    return Forward.of_tokens("r1", "plan1", 0, "entry", SAMPLING, [1, 2, 3])


RULES = DecodingRules(prompt_len=3, grammar='{"grammars": []}', logit_bias=((5, -100.0), (9, 2.5)),
                      presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.1, logprobs=4,
                      echo_logprobs=True)


def with_rules() -> Forward:
    return Forward.of_tokens("r1", "plan1", 0, "entry", SAMPLING, [1, 2, 3], RULES, with_ids=True)


def from_a_kept_prefix() -> Forward:
    return Forward.of_tokens("r1", "plan1", 4, "entry", SAMPLING, [5, 6], RULES, with_ids=True, prefix=[1, 2, 3, 4])


def token_with_logprobs() -> Token:
    rows = TokenLogprobs(np.array([[7, 7, 3], [8, 1, 8]], np.int32), np.array([[-0.5, -0.5, -2], [-3, -1, -3]],
                                                                               np.float32))
    return Token("r1", "plan1", 4, 8, 1500, rows)


def hidden_in() -> Forward:
    step = Forward.of_tokens("r1", "plan1", 5, "entry", None, [9])
    return step.onward(10, encode_array(mx.ones((1, 1, 8))), compute_us=120)


@pytest.mark.parametrize("message", [
    tokens_in(), hidden_in(), Token("r1", "plan1", 4, 49151, 1500), Error("r1", "plan1", "cache", "lost"),
    Release("r1"), Hello(1, "node-a", "swarm"), Rejection("swarm", "not ours"), Ping(5, 16), Pong(5, 1500),
    Pong(5)], ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message) -> None:
    got = decode(on_the_wire(message))
    if isinstance(message, Forward):
        assert (got.rid, got.plan_id, got.pos, got.start, got.entry, got.sampling, got.dtype, got.shape,
                got.compute_us, bytes(got.payload)) == \
            (message.rid, message.plan_id, message.pos, message.start, message.entry, message.sampling,
             message.dtype, message.shape, message.compute_us, bytes(message.payload))
        assert mx.array_equal(got.array(), message.array()).item()
    else:
        assert got == message


def test_a_prompt_sent_on_beside_others_says_how_many_and_one_sent_alone_says_nothing() -> None:
    prompt = Forward.of_tokens("r1", "plan1", 0, "entry", None, [1, 2, 3])
    onward = prompt.onward(10, encode_array(mx.ones((1, 3, 8))), compute_us=5, together=4)
    assert decode(on_the_wire(onward)).together == 4
    alone = prompt.onward(10, encode_array(mx.ones((1, 3, 8))), compute_us=5)
    assert "tg" not in alone.to_frame()[0] and decode(on_the_wire(alone)).together == 0


def test_a_pong_says_how_long_its_ping_may_have_waited_or_nothing() -> None:
    assert decode(on_the_wire(Pong.answering(5, 0.25))).quiet_s() == pytest.approx(0.25)
    assert decode(on_the_wire(Pong.answering(5, 0.25).waited())).quiet_s() == 0.0
    assert Pong.answering(5, 1e12).quiet_us == MAX_QUIET_US and Pong.answering(5, -1.0).quiet_us == 0
    assert "q" not in Pong(5).to_frame()[0]  # (as a peer that does not say sends it)
    assert decode(Frame({"t": "pong", "n": 5})) == Pong(5) and Pong(5).quiet_s() is None


def test_a_forward_knows_its_step() -> None:
    f = tokens_in()
    assert f.length == 3 and not f.is_decode_step and f.array().tolist() == [[1, 2, 3]]
    step = Forward.of_tokens("r1", "plan1", 7, "entry", SAMPLING, [5])
    assert step.is_decode_step and hidden_in().is_decode_step and hidden_in().compute_us == 120


def frame_of(message, changes: dict) -> Frame:
    """The message's frame with header fields changed (`...`: left out)."""
    header, payload = message.to_frame()
    header = {k: v for k, v in {**header, **changes}.items() if v is not ...}
    return Frame(header, payload)


BAD = [
    # (message, header changes, what the error names)
    (tokens_in(), {"a": 0}, "'a'"),
    (Token("r1", "plan1", 4, 3), {"a": -1}, "'a'"),
    (Error("r1", "plan1", "cache", "lost"), {"a": "2"}, "'a'"),
    (Release("r1"), {"a": 2**31}, "'a'"),
    (Pong(5, 0), {"q": -1}, "'q'"),
    (Pong(5, 0), {"q": MAX_QUIET_US + 1}, "'q'"),
    (Pong(5, 0), {"q": float("nan")}, "'q'"),
    (Pong(5, 0), {"q": 1.5}, "'q'"),
    (Pong(5, 0), {"q": "1"}, "'q'"),
    (Pong(5, 0), {"q": True}, "'q'"),
    (Pong(5, 0), {"n": -1}, "'n'"),
    (tokens_in(), {"rid": ""}, "rid"),
    (tokens_in(), {"rid": 7}, "rid"),
    (tokens_in(), {"rid": "x" * 129}, "rid"),
    (tokens_in(), {"plan": None}, "plan"),
    (tokens_in(), {"entry": ...}, "entry"),
    (tokens_in(), {"pos": -1}, "pos"),
    (tokens_in(), {"pos": True}, "pos"),
    (tokens_in(), {"pos": 1.5}, "pos"),
    (tokens_in(), {"pos": 2**31}, "pos"),
    (tokens_in(), {"start": -3}, "start"),
    (tokens_in(), {"cu": -1}, "cu"),
    (tokens_in(), {"shape": [1, 4]}, "bytes"),  # 3 ids of payload
    (tokens_in(), {"shape": [2, 3]}, "shape"),  # one request per frame
    (tokens_in(), {"shape": [1, 0]}, "shape"),
    (tokens_in(), {"shape": [1, 3, 1]}, "shape"),  # token ids are [1, L]
    (tokens_in(), {"shape": "1,3"}, "shape"),
    (tokens_in(), {"dtype": "float32"}, "int32"),  # into layer 0: token ids
    (hidden_in(), {"dtype": "int32"}, "hidden states"),
    (hidden_in(), {"dtype": "float64"}, "hidden states"),
    (hidden_in(), {"shape": [1, 1]}, "shape"),
    (tokens_in(), {"sampling": [0.7]}, "sampling"),
    (tokens_in(), {"sampling": {"temperature": -1, "top_p": 1, "top_k": 0, "seed": 0}}, "temperature"),
    (tokens_in(), {"sampling": {"temperature": float("nan"), "top_p": 1, "top_k": 0, "seed": 0}}, "temperature"),
    (tokens_in(), {"sampling": {"temperature": 1, "top_p": 0, "top_k": 0, "seed": 0}}, "top_p"),
    (tokens_in(), {"sampling": {"temperature": 1, "top_p": 1, "top_k": -1, "seed": 0}}, "top_k"),
    (tokens_in(), {"sampling": {"temperature": 1, "top_p": 1, "top_k": 0, "seed": 2**64}}, "seed"),
    (tokens_in(), {"sampling": {"temperature": 1, "top_p": 1, "top_k": 0}}, "seed"),
    (Token("r1", "p", 4, 7), {"token": -1}, "token"),
    (Token("r1", "p", 4, 7), {"token": 2**31}, "token"),
    (Token("r1", "p", 4, 7), {"at": 0}, "at"),
    (Token("r1", "p", 4, 7), {"token": "7"}, "token"),
    (Error("r1", "p", "cache", "x"), {"kind": "boom"}, "kind"),
    (Error("r1", "p", "cache", "x"), {"message": None}, "message"),
    (Release("r1"), {"rid": None}, "rid"),
    (Hello(1, "n", "s"), {"v": "1"}, "'v'"),
    (Hello(1, "n", "s"), {"node_id": ""}, "node_id"),
    (with_rules(), {"ids": b"\0" * 8}, "ids"),  # 3 positions: 12 bytes
    (with_rules(), {"ids": [1, 2, 3]}, "ids"),
    (with_rules(), {"pos": 4}, "position 0"),  # the rules start a request's caches
    (with_rules(), {"ids": ...}, "ids"),  # rules, but no ids
    (with_rules(), {"rules": {"pl": -1}}, "'pl'"),
    (with_rules(), {"rules": {"pl": 3, "g": ""}}, "'g'"),
    (with_rules(), {"rules": {"pl": 3, "lb": [[1, float("inf")]]}}, "'lb'"),
    (with_rules(), {"rules": {"pl": 3, "lb": [[-1, 1]]}}, "'lb'"),
    (with_rules(), {"rules": {"pl": 3, "pp": "x"}}, "'pp'"),
    (with_rules(), {"rules": {"pl": 3, "rp": 0}}, "'rp'"),
    (with_rules(), {"rules": {"pl": 3, "lp": 21}}, "'lp'"),
    (with_rules(), {"rules": {"pl": 3, "elp": 1}}, "'elp'"),
    (with_rules(), {"rules": [3]}, "map"),
    (token_with_logprobs(), {"lp": [2, 2]}, "'lp'"),  # 2 x 3 in the payload
    (token_with_logprobs(), {"lp": [2, 22]}, "'lp'"),
    (token_with_logprobs(), {"lp": "2x3"}, "'lp'"),
    (tokens_in(), {"tg": 1}, "'tg'"),  # sent alone: no field
    (tokens_in(), {"tg": 1025}, "'tg'"),
    (tokens_in(), {"tg": "4"}, "'tg'"),
    (with_rules(), {"tg": True}, "'tg'"),
    (from_a_kept_prefix(), {"pre": b"\0" * 12}, "'pre'"),  # position 4: 16 bytes
    (from_a_kept_prefix(), {"pre": [1, 2, 3, 4]}, "'pre'"),
    (from_a_kept_prefix(), {"pos": 0, "pre": b""}, "'pre'"),  # position 0 has no prefix
    (from_a_kept_prefix(), {"pre": ...}, "position 0"),  # without its prefix the rules came too late
]


def test_every_answer_and_release_carries_its_attempt() -> None:
    """A replay's frames, answers and release name their attempt; a first attempt's headers stay as they were."""
    for message in (tokens_in()._replace(attempt=3), Token("r1", "plan1", 4, 0, attempt=3),
                    Error("r1", "plan1", "cache", "lost", 3), Release.keeping("r1", [1, 2], 3)):
        assert decode(on_the_wire(message)).attempt == 3
        assert "a" not in message._replace(attempt=0).to_frame()[0]


@pytest.mark.parametrize(("message", "changes", "named"), BAD, ids=[f"{type(m).__name__}-{c}" for m, c, _ in BAD])
def test_malformed_messages_are_refused_naming_the_field(message, changes, named) -> None:
    with pytest.raises(ProtocolError, match=named):
        decode(frame_of(message, changes))


def test_a_payload_that_does_not_fit_its_shape_is_refused() -> None:
    header, payload = hidden_in().to_frame()
    with pytest.raises(ProtocolError, match="needs 32 bytes"):
        decode(Frame(header, bytes(payload)[:-1]))


def test_unknown_types_are_refused_by_name() -> None:
    with pytest.raises(ProtocolError, match="unknown message type 'from-the-future'"):
        decode(Frame({"t": "from-the-future"}))


def test_an_error_message_too_long_for_a_frame_is_shortened() -> None:
    got = decode(on_the_wire(Error("r1", "p", "protocol", "x" * 100_000)))
    assert got == Error("r1", "p", "protocol", "x" * 4093 + "...")


def test_rules_ids_and_logprobs_round_trip() -> None:
    got = decode(on_the_wire(with_rules()))
    assert got.rules == RULES and np.frombuffer(got.ids, "<i4").tolist() == [1, 2, 3]
    onward = got.onward(3, encode_array(mx.ones((1, 3, 8))), 5)
    assert decode(on_the_wire(onward)).rules == RULES and decode(on_the_wire(onward)).token_ids() == [1, 2, 3]
    step = decode(on_the_wire(Forward.of_tokens("r1", "plan1", 9, "entry", SAMPLING, [4], with_ids=True)))
    assert step.rules is None and step.token_ids() == [4]
    plain_header, _ = tokens_in().to_frame()
    assert "ids" not in plain_header and "rules" not in plain_header, "a plain request carries nothing more"
    token = decode(on_the_wire(token_with_logprobs()))
    assert token[:5] == token_with_logprobs()[:5]
    assert token.logprobs.ids.tolist() == [[7, 7, 3], [8, 1, 8]]
    assert token.logprobs.logprobs.tolist() == [[-0.5, -0.5, -2], [-3, -1, -3]]


def test_token_ids_travel_as_int32() -> None:
    f = Forward.of_tokens("r", "p", 0, "e", None, [0, 2**31 - 1])
    assert np.frombuffer(f.payload, dtype=np.int32).tolist() == [0, 2**31 - 1]


def test_a_kept_prefix_and_the_ids_to_keep_round_trip() -> None:
    got = decode(on_the_wire(from_a_kept_prefix()))
    assert got.prefix_ids() == [1, 2, 3, 4] and got.rules == RULES and got.token_ids() == [5, 6]
    assert not got.is_decode_step  # a request starting from a prefix is not one under way
    onward = decode(on_the_wire(got.onward(3, encode_array(mx.ones((1, 2, 8))), 5)))
    assert onward.prefix_ids() == [1, 2, 3, 4]
    assert decode(on_the_wire(tokens_in())).prefix_ids() is None
    keep = list(range(40_000))  # longer than a header may be: the ids travel as the payload
    assert decode(on_the_wire(Release.keeping("r1", keep))).kept_ids().tolist() == keep
    assert decode(on_the_wire(Release.keeping("r1", None))) == Release("r1")
    with pytest.raises(ProtocolError, match="int32"):
        decode(Frame({"t": "rel", "rid": "r1"}, b"\0" * 6))
    with pytest.raises(ProtocolError, match="at most"):  # never turned into millions of Python ints
        decode(Frame({"t": "rel", "rid": "r1"}, b"\0" * (4 * MAX_KEEP_IDS + 4)))


def test_a_step_with_drafts_and_its_answer_round_trip() -> None:
    step = Forward.of_tokens("r1", "plan1", 7, "entry", SAMPLING, [5], drafts=[6, 7, 8])
    assert step.length == 4 and step.array().tolist() == [[5, 6, 7, 8]] and not step.is_decode_step
    onward = step.onward(10, encode_array(mx.ones((1, 4, 8))), compute_us=5)
    for f in (step, onward):
        assert decode(on_the_wire(f)).draft_ids() == [6, 7, 8]
    assert decode(on_the_wire(Forward.of_tokens("r1", "plan1", 7, "entry", SAMPLING, [5]))).drafts is None
    answer = Token("r1", "plan1", 11, 42, 10, accepted=2)
    assert decode(on_the_wire(answer)) == answer and "ac" not in Token("r1", "plan1", 11, 42).to_frame()[0]


@pytest.mark.parametrize("changes", [{"dr": b"\0" * 8}, {"dr": "abc"}, {"sampling": None}],
                         ids=["wrong count", "not bytes", "not sampled"])
def test_malformed_drafts_are_refused_by_name(changes) -> None:
    step = Forward.of_tokens("r1", "plan1", 7, "entry", SAMPLING, [5], drafts=[6, 7, 8])
    with pytest.raises(ProtocolError, match="'dr'"):
        decode(frame_of(step, changes))
    with pytest.raises(ProtocolError, match="'ac'"):
        decode(frame_of(Token("r1", "plan1", 11, 42, accepted=2), {"ac": 65}))
