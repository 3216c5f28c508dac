"""Constrained decoding with llguidance: a grammar becomes a mask over the next token's logits.

llguidance, because a grammar compiles in milliseconds where the other libraries take
seconds on a request's path, its mask costs about 1% of a decode step on the last stage,
a matcher is rebuilt from (grammar, generated tokens) quickly, and the rebuilt
matcher's masks equal the undisturbed one's bit for bit, which is what lets a new
last stage take a request over after churn. Grammars are llguidance's own text
(from a JSON schema or Lark, entry/grammars.py); special tokens are never allowed
inside them, only EOS once the grammar is complete.

`GrammarVocab` is one per node: the tokenizer as llguidance sees it, built on first
use (~0.4 s for a 49k vocabulary), shared by the entry (validating grammars, token
bytes for logprobs) and the last stage (matchers, on the MLX thread).
"""

from __future__ import annotations

import logging
import threading

import llguidance as llg
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

log = logging.getLogger(__name__)


class GrammarVocab:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer  # mlx-lm's TokenizerWrapper
        self.eos_ids = sorted(tokenizer.eos_token_ids)
        self._lock = threading.Lock()
        self._ll: llg.LLTokenizer | None = None

    @property
    def ll(self) -> llg.LLTokenizer:
        if self._ll is None:
            with self._lock:
                if self._ll is None:
                    self._ll = llguidance.hf.from_tokenizer(self.tokenizer._tokenizer, eos_token=self.eos_ids)
        return self._ll

    def check(self, grammar: str) -> str:
        """'' if the grammar is usable with this vocabulary, else why not (for a 400)."""
        err = llg.LLMatcher.validate_grammar(grammar, self.ll)
        return "" if not err or err.startswith("WARNING") else err

    def is_special(self, text: str) -> bool:
        """Whether `text` is one special token of this vocabulary (a grammar names it as a token)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return len(ids) == 1 and self.ll.is_special_token(ids[0])

    def token_bytes(self, token: int) -> bytes:
        return self.ll.decode_bytes([token])

    def matcher(self, grammar: str) -> "GrammarMatcher":
        return GrammarMatcher(self, grammar)


class GrammarMatcher:
    """One request's grammar state on the last stage (MLX thread)."""

    def __init__(self, vocab: GrammarVocab, grammar: str):
        self.vocab = vocab
        self._m = llg.LLMatcher(vocab.ll, grammar, log_level=0)
        self._n = vocab.ll.vocab_size
        self._bitmask = allocate_token_bitmask(1, self._n)
        if self._m.is_error():
            log.warning("grammar rejected on the last stage: %s", self._m.get_error())

    def consume(self, token: int) -> None:
        if self._m.is_error():
            return  # said once below; from here on only EOS is allowed
        if not self._m.consume_token(token):
            log.warning("grammar refused token %d: %s", token, self._m.get_error().splitlines()[0][:300])

    def allowed(self) -> np.ndarray:
        """bool (vocab,) of the tokens allowed next; EOS alone once the grammar is done or broken."""
        if self._m.is_error():  # never expected (the entry validated the grammar): end the request cleanly
            allowed = np.zeros(self._n, np.bool_)
            allowed[self.vocab.eos_ids] = True
            return allowed
        fill_next_token_bitmask(self._m, self._bitmask, 0)
        return np.unpackbits(self._bitmask.reshape(-1).view(np.uint8), bitorder="little")[:self._n].view(np.bool_)

    def mask(self, logits: mx.array) -> mx.array:
        """logits (vocab,) with every token the grammar forbids at -inf."""
        allowed = self.allowed()
        v = logits.shape[-1]
        if v != allowed.shape[0]:  # the model's head may be wider (padded) or narrower than the tokenizer
            allowed = np.pad(allowed, (0, max(0, v - allowed.shape[0])))[:v]
        return mx.where(mx.array(allowed), logits, -mx.inf)
