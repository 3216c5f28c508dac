"""What chat and text completions look like on the wire: whole responses and stream chunks.

One shape object per response; choices carry their index (n > 1). Logprobs come in
OpenAI's two forms: chat's `{"content": [{token, logprob, bytes, top_logprobs}]}`
and legacy completions' `{tokens, token_logprobs, top_logprobs, text_offset}`.
"""

from __future__ import annotations

import time
import uuid

from ..entry.service import Finished, TokenScore


class TokenTexts:
    """Token ids as the client sees them: text and raw bytes (engine/constraints.GrammarVocab)."""

    def __init__(self, vocab):
        self.vocab = vocab
        self._memo: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        got = self._memo.get(token)
        if got is None:
            raw = self.vocab.token_bytes(token)
            # A byte-level token may be part of a character: shown escaped, its bytes exact.
            got = self._memo[token] = (raw.decode("utf-8", errors="backslashreplace"), list(raw))
        return got


def usage(prompt_tokens: int, finished: list[Finished]) -> dict:
    completion = sum(f.completion_tokens for f in finished)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _route(done: Finished) -> dict:
    return {"swarm": done.route} if done.route else {}


class ChatShape:
    def __init__(self, model: str, texts: TokenTexts):
        self.id, self.model, self.created = f"chatcmpl-{uuid.uuid4().hex}", model, int(time.time())
        self.texts = texts

    def _chunk(self, choices: list) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": choices}

    def opening(self, n: int) -> dict | None:
        return self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None} for i in range(n)])

    def delta(self, index: int, text: str, tool_calls: list[dict], scores: list[TokenScore] | None,
              offset: int = 0, first_unscored: bool = False) -> dict:
        delta: dict = {"content": text} if text else {}
        if tool_calls:
            delta["tool_calls"] = tool_calls
        return self._chunk([{"index": index, "delta": delta, "logprobs": self._logprobs(scores),
                             "finish_reason": None}])

    def final(self, index: int, done: Finished) -> dict:
        return {**self._chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": done.reason}]),
                **_route(done)}

    def usage_chunk(self, prompt_tokens: int, finished: list[Finished]) -> dict:
        return {**self._chunk([]), "usage": usage(prompt_tokens, finished)}

    def whole(self, choices: list["Collected"], prompt_tokens: int) -> dict:
        out = []
        for i, c in enumerate(choices):
            message: dict = {"role": "assistant", "content": c.text if c.text or not c.tool_calls else None}
            if c.tool_calls:
                message["tool_calls"] = [{k: v for k, v in call.items() if k != "index"} for call in c.tool_calls]
            out.append({"index": i, "message": message, "finish_reason": c.done.reason,
                        "logprobs": self._logprobs(c.scores) if c.wants_logprobs else None})
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": out, "usage": usage(prompt_tokens, [c.done for c in choices]), **_route(choices[0].done)}

    def _logprobs(self, scores: list[TokenScore] | None) -> dict | None:
        if scores is None:
            return None
        return {"content": [self._entry(s) for s in scores], "refusal": None}

    def _entry(self, s: TokenScore) -> dict:
        text, raw = self.texts(s.token)
        top = []
        for token, lp in s.top:
            t, b = self.texts(token)
            top.append({"token": t, "logprob": lp, "bytes": b})
        return {"token": text, "logprob": s.logprob, "bytes": raw, "top_logprobs": top}


class TextShape:
    def __init__(self, model: str, texts: TokenTexts):
        self.id, self.model, self.created = f"cmpl-{uuid.uuid4().hex}", model, int(time.time())
        self.texts = texts

    def _chunk(self, choices: list) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": choices}

    def opening(self, n: int) -> None:
        return None

    def delta(self, index: int, text: str, tool_calls: list[dict], scores: list[TokenScore] | None,
              offset: int = 0, first_unscored: bool = False) -> dict:
        return self._chunk([{"index": index, "text": text, "finish_reason": None,
                             "logprobs": self.logprobs(scores, offset, first_unscored)}])

    def final(self, index: int, done: Finished) -> dict:
        return {**self._chunk([{"index": index, "text": "", "finish_reason": done.reason, "logprobs": None}]),
                **_route(done)}

    def usage_chunk(self, prompt_tokens: int, finished: list[Finished]) -> dict:
        return {**self._chunk([]), "usage": usage(prompt_tokens, finished)}

    def whole(self, choices: list["Collected"], prompt_tokens: int) -> dict:
        out = [{"index": i, "text": c.text, "finish_reason": c.done.reason,
                "logprobs": self.logprobs(c.scores, 0, c.first_unscored) if c.wants_logprobs else None}
               for i, c in enumerate(choices)]
        return {**self._chunk(out), "usage": usage(prompt_tokens, [c.done for c in choices]),
                **_route(choices[0].done)}

    def logprobs(self, scores: list[TokenScore] | None, offset: int, first_unscored: bool) -> dict | None:
        """Legacy form; `first_unscored`: the first entry is the prompt's first token, which has no logprob."""
        if scores is None:
            return None
        tokens, lps, tops, offsets = [], [], [], []
        for i, s in enumerate(scores):
            text, _ = self.texts(s.token)
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
            if first_unscored and i == 0:
                lps.append(None)
                tops.append(None)
                continue
            lps.append(s.logprob)
            top = {self.texts(t)[0]: lp for t, lp in s.top}
            top.setdefault(text, s.logprob)  # OpenAI: the sampled token is always among them
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


class Collected:
    """One choice of a non-streaming response, gathered."""

    def __init__(self, wants_logprobs: bool):
        self.wants_logprobs = wants_logprobs
        self.text = ""
        self.tool_calls: list[dict] = []
        self.scores: list[TokenScore] = []
        self.first_unscored = False
        self.done: Finished | None = None
