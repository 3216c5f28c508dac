"""The peer protocol's messages, typed: built and checked here and nowhere else.

Each message is an immutable NamedTuple with `to_frame()` (the header dict and
payload that frames.py puts on the wire) and `from_frame()`, which validates the
header once, where frames come in (the data lane), and raises ProtocolError for
anything that is not a well-formed message of its type, naming the field. It checks
what the message itself can know (types, ranges, that a payload fits its dtype and
shape); whether the sender may send it, or whether a plan's stage can serve it, is
decided by whoever receives it (node/inbox.py, stage/stage_service.py). The handshake's
messages are in handshake_messages.py, the field checks both use in wire_fields.py;
`decode` knows them all.

NamedTuples, not frozen dataclasses, and each check once, in the order a problem is
named, nothing built before they all pass: a forward is decoded and re-encoded on every
hop, right after a stage's compute has evicted the caches, where every extra call costs
many times its warm price, and a frozen dataclass's __init__ is one of the dearest.

Per generated token a request makes one hop per stage boundary plus one back:
entry -> stage 0 -> ... -> last stage -> entry. When the entry node is stage 0 (the
common case) the first hop is a local call, so K stages cost K network messages per
token: K-1 activations and 1 token.

The header keys are the wire format of protocol version 3 (handshake.py): short,
because one goes with every hop.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Union

import mlx.core as mx
import numpy as np

from ..engine.decoding_rules import MAX_TOKEN_ID, DecodingRules
from ..engine.draft_check import MAX_DRAFTS
from ..engine.sampling import SamplingParams
from ..engine.token_logprobs import TokenLogprobs
from .arrays import WIRE_DTYPES, decode_array
from .errors import ProtocolError
from .frames import Frame
from .handshake_messages import HANDSHAKE_MESSAGES, Admitted, Hello, Proof, Rejection
from .ping_messages import Ping, Pong
from .probe_messages import Probe, Probed
from .wire_fields import MAX_TEXT_CHARS, brief, int_error, int_field, is_id, text_error, text_field

MAX_POSITION = 2**31 - 1
MAX_COMPUTE_US = 2**62
MAX_KEEP_IDS = 1 << 21  # token ids a Release may name (more than any context a node serves)
MAX_TOGETHER = 1024  # prompts one pass may have sent side by side (Forward.together)
MAX_ATTEMPT = 2**31 - 1
_U64 = 2**64
_HIDDEN_DTYPES = frozenset(WIRE_DTYPES) - {"int32"}


def _attempt(h: dict) -> int:
    """A message's attempt ('a'), present only when it is not the first."""
    return int_field(h, "a", 1, MAX_ATTEMPT)


def sampling_from_wire(value: Any) -> SamplingParams | None:
    """The sampling parameters a forward carries (None: do not sample); ProtocolError if malformed."""
    if value is None:
        return None
    if type(value) is not dict:
        raise ProtocolError(f"'sampling' must be a map or nil, got {brief(value)}")
    t, p, k, seed = value.get("temperature"), value.get("top_p"), value.get("top_k"), value.get("seed")
    if not (type(t) in (float, int) and 0 <= t < math.inf):  # (nan fails every comparison)
        raise ProtocolError(f"sampling temperature must be a finite number >= 0, got {brief(t)}")
    if not (type(p) in (float, int) and 0 < p <= 1):
        raise ProtocolError(f"sampling top_p must be in (0, 1], got {brief(p)}")
    if type(k) is not int or k < 0:
        raise ProtocolError(f"sampling top_k must be an integer >= 0, got {brief(k)}")
    if type(seed) is not int or not 0 <= seed < _U64:
        raise ProtocolError(f"sampling seed must be an integer in [0, 2^64), got {brief(seed)}")
    return SamplingParams(float(t), float(p), k, seed)


def rules_from_wire(value: Any) -> DecodingRules:
    """A request's decoding rules (engine/decoding_rules.py); ProtocolError if malformed."""
    try:
        return DecodingRules.from_wire(value)
    except ValueError as e:
        raise ProtocolError(f"'fwd' message: {e}") from None


MAX_LOGPROB_ROWS = MAX_POSITION
MAX_LOGPROB_COLS = 21  # the token and up to 20 alternatives


def _int32s(tokens: list[int]) -> bytes:
    return np.asarray(tokens, dtype="<i4").tobytes()


# -- the data path ---------------------------------------------------------------------
class Forward(NamedTuple):
    """Positions [pos, pos + length) of one request, into the stage whose layers start at `start`.

    Into stage 0 (start 0) the payload is int32 token ids of shape [1, length]; into a
    later stage, hidden states of shape [1, length, hidden]. With `sampling`, the last
    stage samples the token at pos + length and sends it to `entry`.

    A request with decoding rules (engine/decoding_rules.py) carries them on its forward
    at position 0, and on every forward the int32 token `ids` of its positions, which the
    last stage's sampler follows. Plain requests carry neither.

    A request that starts from a prefix the stages keep (engine/prompt_cache.py) starts at
    pos > 0 with `prefix`: the int32 token ids of positions [0, pos); its rules, if any, come
    with that forward. Every stage must start from exactly those positions.

    A step with `drafts` (speculative decoding) carries the request's last token and draft tokens: `drafts`
    are the int32 ids of positions [pos + 1, pos + length), which the last stage checks (engine/draft_check.py)
    and answers with how many it accepted (Token.accepted). Every stage cuts the positions of drafts not
    accepted off when the request's next forward starts before its cache's end.

    `attempt` counts the entry's restarts of the request (a replay, a run without the kept prefix):
    a stage drops frames of an attempt older than one it saw, so a replay never meets its earlier
    attempt's frames still on the way. The Token or Error that answers a forward carries its attempt.
    """

    T = "fwd"
    rid: str
    plan_id: str
    pos: int
    start: int
    entry: str
    sampling: SamplingParams | None
    dtype: str
    shape: tuple[int, ...]
    payload: bytes | memoryview
    compute_us: int = 0  # what the stages so far spent computing this step (entry/hop_timing.py)
    rules: DecodingRules | None = None
    ids: bytes | None = None  # int32 token ids of positions [pos, pos + length), for a request with rules
    together: int = 0  # a new prompt: how many a pass sent on side by side with it (the next stage waits for them)
    prefix: bytes | None = None  # int32 token ids of [0, pos): the request starts from the stages' kept caches
    attempt: int = 0
    drafts: bytes | None = None  # int32 ids of positions [pos + 1, pos + length): a step that checks drafts

    @classmethod
    def of_tokens(cls, rid: str, plan_id: str, pos: int, entry: str, sampling: SamplingParams | None,
                  tokens: list[int], rules: DecodingRules | None = None, with_ids: bool = False,
                  prefix: list[int] | None = None, attempt: int = 0, drafts: list[int] | None = None) -> Forward:
        """`drafts`: draft tokens after `tokens` (which is then the request's last token alone)."""
        if drafts:
            tokens = [*tokens, *drafts]
        data = np.asarray([tokens], dtype="<i4").tobytes()
        return cls(rid, plan_id, pos, 0, entry, sampling, "int32", (1, len(tokens)), data, 0, rules,
                   data if with_ids else None, 0, None if prefix is None else _int32s(prefix), attempt,
                   _int32s(drafts) if drafts else None)

    def onward(self, start: int, hidden: tuple[str, list[int], memoryview], compute_us: int,
               together: int = 0) -> Forward:
        """The same step into the next stage, carrying this stage's output as `arrays.encode_array` gave it
        (the memoryview keeps the array alive until sent); `together`: see the field."""
        dtype, shape, data = hidden
        return Forward(self.rid, self.plan_id, self.pos, start, self.entry, self.sampling, dtype, tuple(shape),
                       data, compute_us, self.rules, self.ids, together, self.prefix, self.attempt, self.drafts)

    def token_ids(self) -> list[int] | None:
        """The token ids a request with rules carries (None for a plain request)."""
        return None if self.ids is None else np.frombuffer(self.ids, dtype="<i4").tolist()

    def draft_ids(self) -> list[int] | None:
        """The draft tokens a step checks (None: a step without drafts)."""
        return None if self.drafts is None else np.frombuffer(self.drafts, dtype="<i4").tolist()

    def prefix_ids(self) -> list[int] | None:
        """The token ids of the kept prefix this request starts from (None: it does not)."""
        return None if self.prefix is None else np.frombuffer(self.prefix, dtype="<i4").tolist()

    @property
    def length(self) -> int:
        return self.shape[1]

    @property
    def is_decode_step(self) -> bool:
        """One position past the first of a request under way: what several requests may share a batched pass for."""
        return self.pos > 0 and self.shape[1] == 1 and self.prefix is None

    def array(self) -> mx.array:
        return decode_array(self.dtype, list(self.shape), self.payload)

    def to_frame(self) -> tuple[dict, bytes | memoryview]:
        sampling = self.sampling
        header = {"t": "fwd", "rid": self.rid, "plan": self.plan_id, "pos": self.pos, "start": self.start,
                  "entry": self.entry, "sampling": None if sampling is None else sampling.to_dict(),
                  "cu": self.compute_us, "dtype": self.dtype, "shape": list(self.shape)}
        if self.together > 1:
            header["tg"] = self.together
        if self.ids is not None:
            header["ids"] = bytes(self.ids)
            if self.rules is not None:
                header["rules"] = self.rules.to_wire()
        if self.prefix is not None:
            header["pre"] = bytes(self.prefix)
        if self.attempt:
            header["a"] = self.attempt
        if self.drafts is not None:
            header["dr"] = bytes(self.drafts)
        return header, self.payload

    @classmethod
    def from_frame(cls, frame: Frame) -> Forward:
        h, payload = frame.header, frame.payload
        rid, plan, pos, start, entry, cu = h.get("rid"), h.get("plan"), h.get("pos"), h.get("start"), \
            h.get("entry"), h.get("cu")
        dtype, shape = h.get("dtype"), h.get("shape")
        # Each condition once, in the order a problem is named; a frame that passes them all costs one
        # comparison each (a forward is checked on every hop).
        if type(start) is not int or not 0 <= start <= MAX_POSITION:
            raise int_error(h, "start", 0, MAX_POSITION)
        first = start == 0
        if not (type(shape) is list and len(shape) == (2 if first else 3) and type(shape[0]) is int and shape[0] == 1
                and type(shape[1]) is int and shape[1] >= 1 and (first or (type(shape[2]) is int and shape[2] >= 1))):
            raise ProtocolError(f"'fwd' message: shape must be [1, length{'' if first else ', hidden'}] "
                                f"into layer {start}, got {brief(shape)}")
        if first and dtype != "int32":
            raise ProtocolError(f"'fwd' message: token ids into layer 0 must be int32, got {brief(dtype)}")
        if not first and dtype not in _HIDDEN_DTYPES:
            raise ProtocolError(f"'fwd' message: hidden states must be one of {sorted(_HIDDEN_DTYPES)}, "
                                f"got {brief(dtype)}")
        expected = shape[1] * (1 if first else shape[2]) * WIRE_DTYPES[dtype]
        if len(payload) != expected:
            raise ProtocolError(f"'fwd' message: {dtype}{shape} needs {expected} bytes, got {len(payload)}")
        if type(pos) is not int or not 0 <= pos <= MAX_POSITION - shape[1]:
            raise int_error(h, "pos", 0, MAX_POSITION - shape[1])
        if not is_id(rid):
            raise text_error(h, "rid")
        if not is_id(plan):
            raise text_error(h, "plan")
        if not is_id(entry):
            raise text_error(h, "entry")
        if type(cu) is not int or not 0 <= cu <= MAX_COMPUTE_US:
            raise int_error(h, "cu", 0, MAX_COMPUTE_US)
        forward = cls(rid, plan, pos, start, entry, sampling_from_wire(h.get("sampling")), dtype, tuple(shape),
                      payload, cu)
        together = h.get("tg")
        if together is not None:
            if type(together) is not int or not 2 <= together <= MAX_TOGETHER:
                raise ProtocolError(f"'fwd' message: 'tg' must be a whole number from 2 to {MAX_TOGETHER}, "
                                    f"got {brief(together)}")
            forward = forward._replace(together=together)
        prefix = h.get("pre")
        if prefix is not None:
            if type(prefix) is not bytes or len(prefix) != 4 * pos or not pos:
                raise ProtocolError(f"'fwd' message: 'pre' must be the {pos} int32 token ids before position "
                                    f"{pos}, got {brief(prefix)}")
            forward = forward._replace(prefix=prefix)
        attempt = h.get("a")
        if attempt is not None:
            forward = forward._replace(attempt=_attempt(h))
        drafts = h.get("dr")
        if drafts is not None:
            if not (type(drafts) is bytes and len(drafts) == 4 * (shape[1] - 1) and 1 <= shape[1] - 1 <= MAX_DRAFTS
                    and forward.sampling is not None and prefix is None):
                raise ProtocolError(f"'fwd' message: 'dr' must be the {shape[1] - 1} int32 draft ids after position "
                                    f"{pos} (1-{MAX_DRAFTS} of them, in a sampled step without a prefix), "
                                    f"got {brief(drafts)}")
            forward = forward._replace(drafts=drafts)
        if h.get("ids") is None and h.get("rules") is None:
            return forward  # a plain request (the hot path)
        return forward._with_rules(h)

    def _with_rules(self, h: dict) -> Forward:
        ids, rules = h.get("ids"), h.get("rules")
        if type(ids) is not bytes or len(ids) != 4 * self.length:
            raise ProtocolError(f"'fwd' message: 'ids' must be {self.length} int32 token ids, got {brief(ids)}")
        if rules is not None and self.pos != 0 and self.prefix is None:
            raise ProtocolError(f"'fwd' message: 'rules' travel only with a request's first forward (position 0 "
                                f"or a kept prefix), got position {self.pos}")
        return self._replace(rules=None if rules is None else rules_from_wire(rules), ids=ids)


class Token(NamedTuple):
    """The last stage's sampled token for position `at`, back to the request's entry.

    With `logprobs` (a request that asked for them), their rows travel as the payload:
    int32 ids then float32 logprobs, (rows, cols) each, the shape in the header.

    The answer to a step with drafts (Forward.drafts) says how many of them were `accepted`: the tokens it
    brings are those drafts, then `token`, which stands at position `at` - (drafts sent - accepted); `at` is
    the answered forward's end, as for every step. Its logprobs have a row for each of them.
    """

    T = "tok"
    rid: str
    plan_id: str
    at: int
    token: int
    compute_us: int = 0
    logprobs: TokenLogprobs | None = None
    attempt: int = 0  # the answered forward's (Forward.attempt)
    accepted: int = 0  # drafts accepted (a step that checked drafts)

    def to_frame(self) -> tuple[dict, bytes]:
        header = {"t": "tok", "rid": self.rid, "plan": self.plan_id, "at": self.at, "token": self.token,
                  "cu": self.compute_us}
        if self.attempt:
            header["a"] = self.attempt
        if self.accepted:
            header["ac"] = self.accepted
        if self.logprobs is None:
            return header, b""
        header["lp"] = list(self.logprobs.ids.shape)
        return header, self.logprobs.to_bytes()

    @classmethod
    def from_frame(cls, frame: Frame) -> Token:
        h = frame.header
        rid, plan, at, token, cu = h.get("rid"), h.get("plan"), h.get("at"), h.get("token"), h.get("cu")
        if not is_id(rid):
            raise text_error(h, "rid")
        if not is_id(plan):
            raise text_error(h, "plan")
        if type(at) is not int or not 1 <= at <= MAX_POSITION:
            raise int_error(h, "at", 1, MAX_POSITION)
        if type(token) is not int or not 0 <= token <= MAX_TOKEN_ID:
            raise int_error(h, "token", 0, MAX_TOKEN_ID)
        if type(cu) is not int or not 0 <= cu <= MAX_COMPUTE_US:
            raise int_error(h, "cu", 0, MAX_COMPUTE_US)
        token_msg = cls(rid, plan, at, token, cu)
        if h.get("a") is not None:
            token_msg = token_msg._replace(attempt=_attempt(h))
        if h.get("ac") is not None:
            token_msg = token_msg._replace(accepted=int_field(h, "ac", 1, MAX_DRAFTS))
        shape = h.get("lp")
        if shape is None:
            return token_msg
        if not (type(shape) is list and len(shape) == 2 and all(type(d) is int for d in shape)
                and 1 <= shape[0] <= MAX_LOGPROB_ROWS and 1 <= shape[1] <= MAX_LOGPROB_COLS
                and len(frame.payload) == shape[0] * shape[1] * 8):
            raise ProtocolError(f"'tok' message: 'lp' must be [rows, 1-{MAX_LOGPROB_COLS} columns] matching "
                                f"a payload of 8 bytes per cell, got {brief(shape)} and {len(frame.payload)} bytes")
        return token_msg._replace(logprobs=TokenLogprobs.from_bytes(frame.payload, *shape))


class Error(NamedTuple):
    """A stage could not serve a request; sent to the request's entry."""

    T = "err"
    # "link": a link this stage sent the request's frames on broke, so one may be lost (stage/link_requests.py);
    # "prompt_cache_miss": the stage does not keep the prefix the request was to start from (its entry runs it cold)
    KINDS = frozenset({"plan_mismatch", "cache", "protocol", "unreachable", "link", "prompt_cache_miss"})
    rid: str
    plan_id: str
    kind: str
    message: str
    attempt: int = 0  # the failed forward's (Forward.attempt)

    def to_frame(self) -> tuple[dict, bytes]:
        message = self.message  # a long exception text must not make the frame invalid
        if len(message) > MAX_TEXT_CHARS:
            message = message[:MAX_TEXT_CHARS - 3] + "..."
        header = {"t": "err", "rid": self.rid, "plan": self.plan_id, "kind": self.kind, "message": message}
        if self.attempt:
            header["a"] = self.attempt
        return header, b""

    @classmethod
    def from_frame(cls, frame: Frame) -> Error:
        h = frame.header
        kind = h.get("kind")
        if kind not in cls.KINDS:
            raise ProtocolError(f"'err' message: kind must be one of {sorted(cls.KINDS)}, got {brief(kind)}")
        return cls(text_field(h, "rid"), text_field(h, "plan"), kind, text_field(h, "message", MAX_TEXT_CHARS, empty=True),
                   0 if h.get("a") is None else _attempt(h))


class Release(NamedTuple):
    """The entry is done with a request: free its KV caches. With `keep`, the int32 token ids of the
    positions its caches hold: a stage keeps them for later requests that start the same way. Frames
    of `attempt` or an older one that come after it are dropped (Forward.attempt)."""

    T = "rel"
    rid: str
    keep: bytes | None = None
    attempt: int = 0

    @classmethod
    def keeping(cls, rid: str, tokens: list[int] | None, attempt: int = 0) -> Release:
        return cls(rid, _int32s(tokens) if tokens else None, attempt)

    def kept_ids(self) -> np.ndarray | None:
        """The ids, as a view of the frame (a stage turns them into a list only once it holds that many)."""
        return None if self.keep is None else np.frombuffer(self.keep, dtype="<i4")

    def to_frame(self) -> tuple[dict, bytes]:
        header = {"t": "rel", "rid": self.rid}
        if self.attempt:
            header["a"] = self.attempt
        return header, self.keep or b""  # (the ids as the payload: a long one fits no header)

    @classmethod
    def from_frame(cls, frame: Frame) -> Release:
        h, keep = frame.header, frame.payload
        rid, attempt = text_field(h, "rid"), 0 if h.get("a") is None else _attempt(h)
        if not keep:
            return cls(rid, None, attempt)
        if len(keep) % 4 or len(keep) > 4 * MAX_KEEP_IDS:
            raise ProtocolError(f"'rel' message: its payload must be at most {MAX_KEEP_IDS} int32 token ids, got "
                                f"{len(keep)} bytes")
        return cls(rid, bytes(keep), attempt)


Message = Union[Forward, Token, Error, Release, Probe, Probed, Ping, Pong, Hello, Proof, Admitted, Rejection]
_TYPES: dict[str, type] = {m.T: m for m in (Forward, Token, Error, Release, Probe, Probed, Ping, Pong,
                                           *HANDSHAKE_MESSAGES)}


def decode(frame: Frame) -> Message:
    """The typed message a frame carries; ProtocolError for an unknown type or a malformed one."""
    kind = _TYPES.get(frame.header["t"])
    if kind is None:
        raise ProtocolError(f"unknown message type {brief(frame.header['t'])} (known: {sorted(_TYPES)})")
    return kind.from_frame(frame)
