"""Token ids to client text: streaming detokenization and stop strings.

Text that might be the beginning of a stop string is held back until it is known
not to be one, so a client never sees part of a stop string.
"""

from __future__ import annotations


from .detokenizer import IncrementalDecoder


class TextOutput:
    def __init__(self, tokenizer, stop: list[str] | None = None):
        self._detok = IncrementalDecoder(tokenizer)
        self._stop = [s for s in (stop or []) if s]
        self._pending = ""  # decoded but not yet emitted
        self.text = ""  # everything emitted so far
        self.stopped = False  # a stop string was hit
        self.stop_string: str | None = None  # which one

    def add(self, token: int, eos: bool = False) -> str:
        """Feed one generated token; return the text that is now safe to emit."""
        if self.stopped:
            return ""
        if not eos:  # the eos token's own text (e.g. "<|im_end|>") is never shown
            self._pending += self._detok.add(token)
        return self._release(final=False)

    def finish(self) -> str:
        """No more tokens will come: flush what the detokenizer and stop check held."""
        if not self.stopped:
            self._pending += self._detok.finalize()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        # A stop string can only start inside pending text: any emitted suffix that
        # could have begun one was held back.
        for s in self._stop:
            at = self._pending.find(s)
            if at != -1:
                out = self._pending[:at]
                self.stopped, self.stop_string = True, s
                self._pending = ""
                self.text += out
                return out
        keep = 0 if final else self._partial_stop_suffix(self._pending)
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(out):]
        self.text += out
        return out

    def _partial_stop_suffix(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
