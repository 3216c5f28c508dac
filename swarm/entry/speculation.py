"""Speculative decoding at the entry: which draft tokens a request's next step carries. Event loop.

A pipeline pays a whole trip through every stage per step. A step may carry the request's last token and
a few guesses of the tokens after it; the last stage checks them all in one pass and answers with the
guesses it drew itself (engine/draft_check.py), so each accepted guess saves a trip and the output is
what steps of one token give. This module is the one place that knows where guesses come from, how many
to make, and what came of them; the stages and the wire only carry and check them.

Guesses come from prompt lookup (llama.cpp's lookup decoding, vLLM's n-gram proposer): the last 3 (then 2,
then 1) tokens of the prompt and answer so far, an earlier occurrence of them, and the tokens that followed
it. Strong where answers quote their input (rewrites, edits, extraction), idle on free text. A quote is read
in order, so the occurrence of a run of two or more taken is the one nearest after where the last guesses
came from, and after a word the answer changed (a typo fixed, a name replaced) the guesses go on from the
quote's next word (PromptLookup). Without a quote under way the latest occurrence is taken, as far as what
followed the run's occurrences before it agrees (after a list's line break comes its next number: a guess
there is chance, and a step of rejected guesses costs more than one without).
Or from a draft model (`--draft-model`, draft_model.py): a small model of the same tokenizer, whose greedy
tokens are the guesses, on free text too. `auto` with a draft model asks lookup first and takes its guesses
when the last NGRAM tokens occurred before (a quote under way: free, and often long), the draft model
otherwise (a shorter match is mostly chance in a long history, where the model guesses better).

Guesses are greedy also for a sampled request: the last stage accepts a guess while it equals the token it
drew itself at that position (from the request's own (seed, position) key), so what comes out is the
target's draws whatever the guesses, and a sampled guess would only match less often. (The min(1, p/q)
rule of speculative sampling is for drafts drawn at random from the draft model; these are not.)

How many: each request starts at START_DRAFTS, grows by two after a step whose drafts were all accepted
(up to MAX_DRAFTS), halves after one whose first draft was not. Where guessing does not pay (nothing to
look up, or nothing accepted, MISSES steps in a row) a request stops guessing for a while (QUIET_STEPS,
doubling up to MAX_QUIET_STEPS while it keeps missing): its steps then run ahead as plain steps do
(run_ahead.py), which a step with drafts does not (its next position depends on what was accepted). One
step in PEEK_EVERY of such a pause still waits for its token and looks for a quote under way (the last
QUOTE tokens found together before, as where an answer starts to repeat its input): if there is one, the
pause ends there rather than a few steps into the quote (benchmarks/draft_replay.py).

Beside other requests decoding at this entry a request guesses nothing: their steps share batched
passes at the stages (one position each), which a step with drafts would leave, costing them all.
"""

from __future__ import annotations

import bisect
import inspect
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

# (history, most drafts) -> drafts, or an awaitable of them (a draft model computes on the MLX thread); a
# source with a close() has it called when the request ends.
DraftSource = Callable[[list[int], int], list[int] | Awaitable[list[int]]]


class DraftModels(Protocol):
    """A draft model shared by an entry's requests (draft_model.py): one DraftSource per request."""

    name: str

    def for_request(self) -> DraftSource: ...


log = logging.getLogger(__name__)

START_DRAFTS = 4
MAX_DRAFTS = 8
MIN_DRAFTS = 1
NGRAM = 3  # longest run of last tokens looked up
RIVALS = 3  # earlier occurrences of a run whose successors must agree with the latest's to be drafted
QUOTE = 2  # last tokens found together that draft even in a pause (a quote under way)
PEEK_EVERY = 2  # in a pause, one step in this many waits for its token to look for a quote
MISSES = 4  # steps in a row without an accepted draft before a pause
QUIET_STEPS = 8
MAX_QUIET_STEPS = 64
MODES = ("off", "lookup", "draft", "auto")  # --speculate
DRAFTING = ("off", "lookup", "draft", "lookup+draft")  # what a node's requests draft with (speculation_mode)


@dataclass
class SpeculationCounts:
    """What this entry's requests drafted (for /health)."""

    steps: int = 0  # steps that carried drafts
    proposed: int = 0  # drafts sent
    accepted: int = 0  # drafts accepted
    tokens: int = 0  # tokens those steps brought (accepted drafts and the token after them)

    def as_dict(self) -> dict:
        return {"steps": self.steps, "drafts_proposed": self.proposed, "drafts_accepted": self.accepted,
                "tokens_per_pass": round(self.tokens / self.steps, 3) if self.steps else None}


def speculation_mode(asked: str, checks_drafts: bool, draft_model: bool = False) -> str:
    """What this node's requests draft with (one of DRAFTING) for `--speculate asked`, on a model whose caches
    can drop unaccepted positions (`checks_drafts`) or not, with a draft model or not (`--speculate draft`
    without one is refused before: cli.py); said once, at start, when it is off for the model."""
    if asked == "off":
        return "off"
    if not checks_drafts:
        log.info("speculative decoding is off for this model: its caches (a sliding window or a recurrent state) "
                 "cannot drop the positions of drafts that were not accepted%s",
                 "; the draft model is not used" if draft_model else "")
        return "off"
    if asked == "lookup" or not draft_model:
        return "lookup"
    return "draft" if asked == "draft" else "lookup+draft"


def request_speculation(mode: str, counts: SpeculationCounts, draft_model: DraftModels | None = None,
                        word_starts: frozenset[int] = frozenset()) -> Speculation | None:
    """A request's drafting for the node's `mode` (speculation_mode's); None: it drafts nothing.
    `word_starts`: the vocabulary's tokens that begin a word (word_start_tokens), for prompt lookup."""
    if mode == "off":
        return None
    if mode == "lookup":
        lookup = PromptLookup(word_starts=word_starts)
        return Speculation(counts, lookup.drafts, lookup.quote)
    source = draft_model.for_request()
    return Speculation(counts, LookupFirst(source) if mode == "lookup+draft" else source)


def word_start_tokens(vocab: dict[str, int]) -> frozenset[int]:
    """The ids of a vocabulary's tokens that begin with a space or a line break, as byte-level BPE ('Ġ', 'Ċ')
    and SentencePiece ('▁') spell them: where a word begins."""
    return frozenset(i for piece, i in vocab.items() if piece[:1] in ("Ġ", "Ċ", "▁"))


def drafts_allowed(rules) -> bool:
    """Whether a request with these decoding rules may draft: not when its sampler follows every token drawn
    (a grammar, penalties) or scores prompt rows (echo); logprobs and logit bias are checked at each position."""
    return rules is None or not (rules.needs_history or rules.echo_logprobs)


class PromptLookup:
    """Where the history's last tokens occurred before, and what followed: every run of 1..NGRAM tokens indexed
    as the history grows.

    A quote is read in order: once drafts came from some place, the next ones most likely come from just after
    it, even where the answer changed a word there (a fixed typo, a renamed variable). So the lookup keeps a
    cursor (where the last drafts came from, moved past what the answer repeated of it since) and takes the
    occurrence nearest after it within NEAR tokens (of a run of two tokens or more; else the latest)."""

    NEAR = 64  # tokens after the cursor an occurrence may lie and still count as the quote going on
    STRAY = 4  # tokens the answer may write of its own before the quote is taken up again after them

    def __init__(self, shortest: int = 1, word_starts: frozenset[int] = frozenset()) -> None:
        """`shortest`: the shortest run of last tokens that counts as found; `word_starts`: the tokens that
        begin a word (a space or a line break first), where a quote is taken up again after a changed word."""
        self.shortest = shortest
        self.word_starts = word_starts
        self._seen: list[dict[tuple, list[int]]] = [{} for _ in range(NGRAM + 1)]  # n -> run -> successors' places
        self._indexed = 0  # runs ending before this position are in _seen
        self._cursor: int | None = None  # the quote's next place in the history
        self._read = 0  # history before this was compared with the quote
        self._stray = 0  # tokens the answer wrote since it last repeated the quote

    def drafts(self, history: list[int], k: int, least: int | None = None) -> list[int]:
        """Up to k tokens that followed an earlier occurrence of the history's last tokens (of `least` of them
        or more, and then only there, if given)."""
        end = len(history)
        for e in range(max(self._indexed, 1), end):  # runs that end at e (exclusive) and have a successor
            for n in range(1, min(NGRAM, e) + 1):
                self._seen[n].setdefault(tuple(history[e - n:e]), []).append(e)
        self._indexed = max(self._indexed, end)
        self._follow(history)
        at, rivals = self._found(history, least or self.shortest)
        if at is None and least is None:
            at = self._after_changed_word(history)
        if at is None:
            return []
        self._cursor, self._read, self._stray = at, end, 0
        return history[at:at + self._agreed(history, at, rivals, k)]

    def quote(self, history: list[int], k: int) -> list[int]:
        """As drafts, but only where a run of QUOTE or more last tokens occurred before: a quote under way,
        worth drafting even where guessing has not paid lately."""
        return self.drafts(history, k, least=QUOTE)

    def _follow(self, history: list[int]) -> None:
        """Move the cursor past the new tokens that repeat the quote (accepted drafts and what came after)."""
        c = self._cursor
        if c is None:
            return
        for t in history[self._read:]:
            if self._stray or c >= self._read or history[c] != t:
                self._stray += 1
            else:
                c += 1
        self._cursor, self._read = c, len(history)

    def _found(self, history: list[int], shortest: int) -> tuple[int | None, list[int]]:
        """The place after an earlier occurrence of the longest run of last tokens (`shortest` or more) that
        occurred: of its occurrences, the nearest after the cursor (a run of two or more), else the latest.
        Also, for the latest, the places after the run's RIVALS occurrences before it (a quote under way
        has none: it is read in order)."""
        end = len(history)
        for n in range(min(NGRAM, end), shortest - 1, -1):
            places = self._seen[n].get(tuple(history[end - n:]))
            if not places:
                continue
            if self._cursor is not None and n >= 2:  # (a lone token is common: a near one is mostly chance)
                i = bisect.bisect_left(places, self._cursor)
                if i < len(places) and places[i] - self._cursor <= self.NEAR:
                    return places[i], []
            return places[-1], places[-1 - RIVALS:-1]
        return None, []

    @staticmethod
    def _agreed(history: list[int], at: int, rivals: list[int], k: int) -> int:
        """How many of the k tokens from `at` on also followed every rival occurrence: where the same run was
        followed by different tokens (a list's next number, a name that changes), guessing one is chance."""
        end, n = len(history), 0
        while n < k and at + n < end and all(p + n < end and history[p + n] == history[at + n] for p in rivals):
            n += 1
        return n

    def _after_changed_word(self, history: list[int]) -> int | None:
        """Where the quote goes on after the few tokens the answer just wrote of its own in place of its next
        ones: after the quote's next word where the answer wrote a word (a word fixed or renamed), else as many
        tokens on (a digit or a mark changed)."""
        c, stray = self._cursor, self._stray
        if c is None or not self.word_starts or not 0 < stray <= self.STRAY:
            return None
        if history[-stray] not in self.word_starts:
            return c + stray if c + stray < len(history) - stray else None
        for p in range(c + 1, min(c + 1 + 2 * self.STRAY, len(history) - stray)):
            if history[p] in self.word_starts:
                return p
        return None


class LookupFirst:
    """Prompt lookup's guesses where the last NGRAM tokens occurred before, else the draft model's."""

    def __init__(self, model: DraftSource):
        self.lookup, self.model = PromptLookup(shortest=NGRAM), model

    async def __call__(self, history: list[int], k: int) -> list[int]:
        return self.lookup.drafts(history, k) or await self.model(history, k)

    def close(self) -> None:
        if (close := getattr(self.model, "close", None)) is not None:
            close()


class Speculation:
    """One request's drafting (the generation loop's, entry/generate.py)."""

    def __init__(self, counts: SpeculationCounts | None = None, source: DraftSource | None = None,
                 quote: DraftSource | None = None):
        """`source`: where drafts come from (prompt lookup unless given); its close(), if any, is called when
        the request ends (close below). `quote`: drafts only where a quote is under way, asked during a pause
        (PromptLookup.quote; none: a pause drafts nothing)."""
        if source is None:
            lookup = PromptLookup()
            source, quote = lookup.drafts, lookup.quote
        self.source, self.quote = source, quote
        self.k = START_DRAFTS
        self.counts = counts or SpeculationCounts()
        self._misses = 0
        self._quiet = 0  # steps left without drafts
        self._quiet_next = QUIET_STEPS
        self._armed = False  # the step now due may have left already, without drafts (run ahead)

    async def next_drafts(self, history: list[int], room: int, crowded: bool) -> list[int]:
        """Drafts for the step of history's last token. `room`: tokens the request may still take after that
        step's own; `crowded`: other requests decode beside it at this entry."""
        armed, self._armed = self._armed, False
        if armed or crowded or room <= 0:
            self._quiet = max(0, self._quiet - 1)
            return []
        if self._quiet:
            self._quiet -= 1
            drafts = self.quote(history, min(self.k, room)) if self.quote is not None else []
            if drafts:
                self._quiet = 0
            return drafts
        drafts = self.source(history, min(self.k, room))
        if inspect.isawaitable(drafts):
            drafts = await drafts
        if not drafts:
            self._missed()
        return drafts

    def may_run_ahead(self, crowded: bool) -> bool:
        """Whether the step after the one just sent may leave without drafts, before its token is known here
        (run_ahead.py): when it would carry none anyway. Call after next_drafts, once per step."""
        self._armed = crowded or (self._quiet > 0 and (self.quote is None or self._quiet % PEEK_EVERY != 0))
        return self._armed

    def checked(self, drafted: int, accepted: int) -> None:
        """A step with `drafted` drafts came back with `accepted` of them."""
        if not drafted:
            return
        c = self.counts
        c.steps, c.proposed, c.accepted, c.tokens = c.steps + 1, c.proposed + drafted, c.accepted + accepted, \
            c.tokens + accepted + 1
        if accepted == drafted:
            self.k = min(MAX_DRAFTS, self.k + 2)
        elif accepted == 0:
            self.k = max(MIN_DRAFTS, self.k // 2)
        if accepted:
            self._misses, self._quiet_next = 0, QUIET_STEPS
        else:
            self._missed()

    def close(self) -> None:
        """The request ended (done, failed or cut off): its source frees what it holds for it."""
        close = getattr(self.source, "close", None)
        if close is not None:
            close()

    def _missed(self) -> None:
        self._misses += 1
        if self._misses >= MISSES:
            self._misses, self._quiet = 0, self._quiet_next
            self._quiet_next = min(MAX_QUIET_STEPS, 2 * self._quiet_next)
