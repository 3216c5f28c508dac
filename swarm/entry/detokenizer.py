"""Incremental detokenization whose concatenated output equals tokenizer.decode(tokens).

mlx-lm's streaming detokenizers trim the first token's leading space, which
changes a completion's text. Here each step decodes a short window of recent
tokens twice (without and with the new token) and emits the difference; both
decodes start at the same token, so tokenizer quirks at a window's start cancel.
"""

from __future__ import annotations


class IncrementalDecoder:
    def __init__(self, tokenizer):
        self._decode = tokenizer.decode
        self._tokens: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # tokens already turned into emitted text

    def add(self, token: int) -> str:
        self._tokens.append(token)
        return self._emit(final=False)

    def finalize(self) -> str:
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        done = self._decode(self._tokens[self._prefix:self._read])
        full = self._decode(self._tokens[self._prefix:])
        # An incomplete UTF-8 sequence decodes to U+FFFD: wait for the bytes that complete it.
        if len(full) <= len(done) or (full.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self._tokens)
        return full[len(done):]
