"""Drafts for a request's next decode step, and how many of them to send: the entry's one place for it.

A decode step may carry the request's last token and up to k drafts of the tokens after it; the last
stage draws a token at every position by the request's own rule and returns the drafts it accepted
(each equal to the token drawn before it) plus the token after them (engine/shard_runner.py,
`_verify`). Every accepted draft is a trip through the pipeline saved; the output is what steps of
one would give, since each token is still drawn from the model at its own position.

Drafts come from prompt lookup (llama.cpp's lookup decoding, vLLM's n-gram proposer): the last n
tokens of the prompt and answer so far (n from 3 down to 1), their latest earlier occurrence, and
what followed it. Free text rarely continues an earlier n-gram, copy-and-fix answers mostly do.

How many to send adapts to the request's own recent acceptance: a pass over more positions costs
more on a CPU, so a request whose drafts are rejected sends fewer, none after a few misses, and
probes again now and then.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

START_DRAFTS = 4
MAX_DRAFTS = 8
MAX_NGRAM = 3
MIN_NGRAM = 1  # (a single token: the quickest to find the input again after an edit; rejections pause drafting)
MISSES_TO_PAUSE = 3  # verifying steps that accepted nothing before a request stops drafting
PROBE_EVERY = 8  # steps without drafts between two probes of a paused request


def lookup_drafts(history: list[int], k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the history's last n tokens
    (the longest n that occurs, from max_ngram down to min_ngram)."""
    if k <= 0 or len(history) < 2:
        return []
    for n in range(min(max_ngram, len(history) - 1), min_ngram - 1, -1):
        tail = history[-n:]
        # the latest start i < len - n whose n tokens equal the tail
        for i in range(len(history) - n - 1, -1, -1):
            if history[i:i + n] == tail:
                return history[i + n:i + n + k]
    return []


@dataclass
class Drafting:
    """One request's drafting state: how many drafts its next step may carry."""
    k: int = START_DRAFTS
    misses: int = 0
    paused_for: int = 0

    def budget(self) -> int:
        if self.k > 0:
            return self.k
        self.paused_for += 1
        if self.paused_for >= PROBE_EVERY:  # a cheap probe: the text may have turned to quoting
            self.paused_for = 0
            return 2
        return 0

    def checked(self, proposed: int, accepted: int) -> None:
        """A step that could carry drafts carried `proposed` (0: lookup found none) and `accepted` were."""
        if proposed == 0:
            return
        if accepted == proposed:
            self.k, self.misses = min(max(self.k, proposed) + 2, MAX_DRAFTS), 0
        elif accepted == 0:
            self.misses += 1
            self.k = 0 if self.misses >= MISSES_TO_PAUSE else max(1, self.k // 2)
        else:
            self.k, self.misses = max(1, accepted + 1), 0


@dataclass
class SpeculationStats:
    """What /health shows: drafts proposed and accepted, tokens per decode pass."""
    on: bool = True
    proposed: int = 0
    accepted: int = 0
    passes: int = 0
    tokens: int = 0

    def to_dict(self) -> dict:
        return {"on": self.on, "drafts_proposed": self.proposed, "drafts_accepted": self.accepted,
                "tokens_per_pass": round(self.tokens / self.passes, 3) if self.passes else None}


@dataclass
class Speculation:
    """The drafting policy of an entry. `enabled` False: no step carries drafts (--speculate off, or a
    model whose caches cannot be trimmed)."""
    enabled: bool = True
    stats: SpeculationStats = field(default_factory=SpeculationStats)

    def __post_init__(self):
        self.stats.on = self.enabled

    def for_request(self, wanted: bool = True) -> RequestSpeculation | None:
        return RequestSpeculation(self) if self.enabled and wanted else None


class RequestSpeculation:
    """One request's drafting and acceptance bookkeeping (entry/generate.py asks it each decode step)."""

    def __init__(self, policy: Speculation):
        self.policy, self.drafting = policy, Drafting()
        self._could_draft = False  # the last step asked for drafts (its budget was not 0)
        self._found = True  # lookup found drafts for the last step that asked
        self._skip_next = False  # the next step was started without drafts (arm_next)
        self._skipped = False  # this step was (the next one looks up again)

    def arm_next(self) -> bool:
        """Whether the step after this one (which carries no drafts) goes without drafts too, so the MLX thread
        may start it the moment this one's token is in (run_ahead.py): when drafting is paused, or lookup
        found nothing this time (the next token rarely changes that; the step after may draft again)."""
        d = self.drafting
        if (d.k > 0 and (self._found or self._skipped)) or (d.k == 0 and d.paused_for + 1 >= PROBE_EVERY):
            return False
        self._skip_next = True
        return True

    def drafts(self, history: list[int], room: int) -> list[int]:
        """The drafts for the step after `history` (room: tokens the request may still produce after the
        step's own)."""
        self._skipped = self._skip_next
        if self._skip_next:  # (its step was started without them: arm_next)
            self._skip_next = self._could_draft = self._found = False
            if self.drafting.k == 0:
                self.drafting.paused_for += 1
            return []
        k = min(self.drafting.budget(), room)
        self._could_draft = k > 0
        drafts = lookup_drafts(history, k) if k > 0 else []
        self._found = bool(drafts)
        return drafts

    def checked(self, proposed: int, tokens: int) -> None:
        """A step that carried `proposed` drafts returned `tokens` tokens (accepted drafts + 1)."""
        stats = self.policy.stats
        stats.passes += 1
        stats.tokens += tokens
        stats.proposed += proposed
        stats.accepted += tokens - 1
        if self._could_draft:
            self.drafting.checked(proposed, tokens - 1)
        self._could_draft = False


def speculation_for(mode: str, outline) -> Speculation:
    """The entry's policy for `--speculate` (off, lookup, auto) and the model's outline (engine/model_outline.py):
    off, said once, for a model whose caches cannot take rejected drafts back."""
    if mode == "off":
        return Speculation(enabled=False)
    if outline.untrimmable:
        log.info("speculative decoding off for this %s model: its %s caches cannot be trimmed back to the "
                 "accepted drafts", outline.family, outline.untrimmable)
        return Speculation(enabled=False)
    log.info("speculative decoding on: drafts by prompt lookup")
    return Speculation(enabled=True)
