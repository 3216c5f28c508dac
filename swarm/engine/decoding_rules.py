"""What a request asks of its sampler beyond temperature, top-p, top-k and seed.

A grammar (structured output, forced tool calls), logit bias, penalties and
logprobs: state that depends on the tokens generated so far, kept by the last stage
(engine/request_sampler.py). The rules travel once per pipeline attempt, with the
forward that starts the request's caches (position 0); from then on every forward of
the request carries its token ids, so a new last stage after churn rebuilds exactly
the state an undisturbed run had (entry/generate.py replays the whole history).

A request without rules is None here and on the wire: plain sampling pays nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_GRAMMAR_CHARS = 32 * 1024  # with a prefill chunk's ids it must fit one frame header (64 KiB)
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows
MAX_TOP_LOGPROBS = 20
MAX_TOKEN_ID = 2**31 - 1  # token ids travel as int32 (transport/messages.py checks a frame's by it too)


@dataclass(frozen=True)
class DecodingRules:
    prompt_len: int = 0  # positions before the first generated token (set by the entry)
    grammar: str | None = None  # an llguidance grammar (engine/constraints.py), validated by the entry
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0  # OpenAI's: on generated tokens
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # vLLM's / Hugging Face's: on prompt and generated tokens, 1 = off
    logprobs: int | None = None  # each sampled token's logprob and this many alternatives; None: none
    echo_logprobs: bool = False  # the same for every prompt token after the first (legacy completions echo)

    @property
    def needs_history(self) -> bool:
        """Whether the sampler needs the generated tokens (grammar state, penalties)."""
        return bool(self.grammar or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0)

    def to_wire(self) -> dict:
        w: dict = {"pl": self.prompt_len}
        if self.grammar is not None:
            w["g"] = self.grammar
        if self.logit_bias:
            w["lb"] = [[t, b] for t, b in self.logit_bias]
        if self.presence_penalty:
            w["pp"] = self.presence_penalty
        if self.frequency_penalty:
            w["fp"] = self.frequency_penalty
        if self.repetition_penalty != 1.0:
            w["rp"] = self.repetition_penalty
        if self.logprobs is not None:
            w["lp"] = self.logprobs
        if self.echo_logprobs:
            w["elp"] = True
        return w

    @classmethod
    def from_wire(cls, w) -> "DecodingRules":
        """Raises ValueError naming what is malformed."""
        if type(w) is not dict:
            raise ValueError(f"rules must be a map, got {type(w).__name__}")
        pl = w.get("pl")
        if type(pl) is not int or not 0 <= pl <= 2**31 - 1:
            raise ValueError(f"rules 'pl' must be a position, got {pl!r}")
        grammar = w.get("g")
        if grammar is not None and (type(grammar) is not str or not grammar or len(grammar) > MAX_GRAMMAR_CHARS):
            raise ValueError(f"rules 'g' must be a grammar of 1-{MAX_GRAMMAR_CHARS} characters")
        bias = w.get("lb", [])
        if (type(bias) is not list or len(bias) > MAX_LOGIT_BIAS
                or not all(type(e) is list and len(e) == 2 and type(e[0]) is int and 0 <= e[0] <= MAX_TOKEN_ID
                           and _finite(e[1]) for e in bias)):
            raise ValueError(f"rules 'lb' must be at most {MAX_LOGIT_BIAS} [token id, bias] pairs")
        pp, fp, rp = w.get("pp", 0.0), w.get("fp", 0.0), w.get("rp", 1.0)
        for key, v in (("pp", pp), ("fp", fp), ("rp", rp)):
            if not _finite(v):
                raise ValueError(f"rules {key!r} must be a finite number, got {v!r}")
        if rp <= 0:
            raise ValueError(f"rules 'rp' must be > 0, got {rp!r}")
        lp = w.get("lp")
        if lp is not None and (type(lp) is not int or not 0 <= lp <= MAX_TOP_LOGPROBS):
            raise ValueError(f"rules 'lp' must be 0-{MAX_TOP_LOGPROBS} or nil, got {lp!r}")
        echo = w.get("elp", False)
        if type(echo) is not bool:
            raise ValueError(f"rules 'elp' must be a boolean, got {echo!r}")
        return cls(pl, grammar, tuple((t, float(b)) for t, b in bias), float(pp), float(fp), float(rp), lp, echo)


def _finite(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v)
