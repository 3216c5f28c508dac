"""The node's inference service: prompts in, text events out, any pipeline behind."""

from __future__ import annotations

import uuid
from contextlib import aclosing
from dataclasses import dataclass
from typing import AsyncIterator

from ..engine.sampling import SamplingParams
from .generate import GenerationJob, PipelineSource, generate_tokens
from .stats import RequestStats
from .text_output import TextOutput


@dataclass
class TextDelta:
    text: str


@dataclass
class Finished:
    reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    route: dict | None = None  # which plan and nodes the request went through


class PromptTooLong(ValueError):
    """The prompt cannot fit the model's context (found out before tokenizing all of it)."""


class InferenceService:
    def __init__(self, tokenizer, context_length: int, get_pipeline: PipelineSource,
                 stats: RequestStats, default_max_tokens: int = 512, recovery_timeout: float = 30.0):
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.get_pipeline = get_pipeline
        self.stats = stats
        self.default_max_tokens = default_max_tokens
        self.recovery_timeout = recovery_timeout
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        vocab = tokenizer.get_vocab()
        self.vocab_size = len(vocab)
        # No token decodes to more characters than its vocabulary entry has, so a text longer than
        # context x this cannot fit: it is refused before the tokenizer spends memory on it.
        self._max_chars_per_token = max(map(len, vocab), default=1) or 1

    def encode_chat(self, messages: list[dict]) -> list[int]:
        if len(messages) > self.context_length:
            raise PromptTooLong(f"{len(messages)} messages cannot fit this model's context of "
                                f"{self.context_length} tokens")
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self._encode(text, add_special_tokens=False)  # what tokenize=True does, after our size check

    def encode_text(self, text: str) -> list[int]:
        return self._encode(text, add_special_tokens=True)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) > self.context_length * self._max_chars_per_token:
            raise PromptTooLong(f"a prompt of {len(text)} characters cannot fit this model's context of "
                                f"{self.context_length} tokens")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def budget(self, prompt_len: int, max_tokens: int | None) -> int:
        """Tokens this request may generate; raises ValueError when the prompt leaves no room."""
        room = self.context_length - prompt_len
        if room < 1 or (max_tokens is not None and max_tokens > room):
            wanted = max_tokens if max_tokens is not None else 1
            raise ValueError(f"this model's context is {self.context_length} tokens; the prompt has "
                             f"{prompt_len} and {wanted} more were requested")
        return max_tokens if max_tokens is not None else min(self.default_max_tokens, room)

    async def complete(self, prompt: list[int], sampling: SamplingParams, max_tokens: int,
                       stop: list[str]) -> AsyncIterator[TextDelta | Finished]:
        job = GenerationJob(uuid.uuid4().hex, prompt, sampling, max_tokens, self.eos_ids)
        out = TextOutput(self.tokenizer, stop)
        reason = "length"
        with self.stats.track(job.request_id):
            async with aclosing(generate_tokens(job, self.get_pipeline, self.recovery_timeout)) as tokens:
                async for token in tokens:
                    self.stats.token()
                    eos = token in self.eos_ids
                    if text := out.add(token, eos=eos):
                        yield TextDelta(text)
                    if eos or out.stopped:
                        reason = "stop"
                        break
            if tail := out.finish():
                yield TextDelta(tail)
            yield Finished(reason, len(prompt), len(job.generated), job.route)
