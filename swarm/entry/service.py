"""The node's inference service: prompts in, text events out, any pipeline behind."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from functools import partial
from dataclasses import dataclass, field, replace
from typing import AsyncIterator

from ..engine.constraints import GrammarVocab
from ..engine.decoding_rules import DecodingRules
from ..engine.sampling import SamplingParams
from ..engine.token_logprobs import TokenLogprobs
from .chat_prompt import ChatPrompt
from .generate import GenerationJob, PipelineSource, default_prefill_step, generate_tokens
from .speculation import DraftModels, SpeculationCounts, drafts_allowed, request_speculation, word_start_tokens
from .stats import RequestStats
from .text_output import TextOutput
from .tool_call_output import ToolCallOutput


@dataclass(frozen=True)
class TokenScore:
    """A token's logprob under the model, and the most likely alternatives (best first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class TextDelta:
    text: str
    tool_calls: list[dict] = field(default_factory=list)  # complete calls in OpenAI's form (tool_call_output.py)
    logprobs: list[TokenScore] = field(default_factory=list)  # of the tokens since the last delta
    token_ids: list[int] = field(default_factory=list)  # every token generated since the last delta (EOS too)


@dataclass
class PromptScores:
    """Echo: the prompt tokens' logprobs, from the second token on (comes before any text)."""

    scores: list[TokenScore]


@dataclass
class Finished:
    reason: str  # "stop", "length" or "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    route: dict | None = None  # which plan and nodes the request went through
    stop_sequence: str | None = None  # the stop string that ended it (reason "stop")


class PromptTooLong(ValueError):
    """The prompt cannot fit the model's context (found out before tokenizing all of it)."""


# Templating, tokenizing and grammar checks run on these threads, never on the event loop: a prompt
# of a few hundred thousand characters takes the tokenizer most of a second, which on the loop
# stalled /health, peers' probes and every other request. Two, so a burst of huge prompts queues
# here and leaves a core to the MLX thread (the tokenizer releases the GIL while it works).
PROMPT_THREADS = 2


def content_chars(messages: list[dict]) -> int:
    """Characters of the messages' contents (text, or its text parts): a lower bound of what any chat
    template renders of them, so a prompt past the context is refused before the template runs."""
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return total


class InferenceService:
    def __init__(self, tokenizer, context_length: int, get_pipeline: PipelineSource,
                 stats: RequestStats, default_max_tokens: int = 512, recovery_timeout: float = 30.0,
                 vocab: GrammarVocab | None = None, prefill_step: int | None = None, speculate: str = "off",
                 draft_model: DraftModels | None = None):
        """`prefill_step`: positions per prompt chunk (`--prefill-chunk`, generate.py); None: the backend's.
        `speculate`: what decode steps draft with, speculation_mode's ('off': nothing; speculation.py), with
        `draft_model` (draft_model.py) where it says 'draft'."""
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.get_pipeline = get_pipeline
        self.stats = stats
        self.default_max_tokens = default_max_tokens
        self.recovery_timeout = recovery_timeout
        self.prefill_step = prefill_step or default_prefill_step()
        self.speculate = speculate
        self.draft_model = draft_model if "draft" in speculate else None
        self.speculation = SpeculationCounts()  # what this entry's requests drafted (/health)
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.vocab = vocab or GrammarVocab(tokenizer)
        self.chat_prompt = ChatPrompt(tokenizer)
        vocab_entries = tokenizer.get_vocab()
        self.vocab_size = len(vocab_entries)
        self.word_starts = word_start_tokens(vocab_entries) if speculate != "off" else frozenset()
        # No token decodes to more characters than its vocabulary entry has, so a text longer than
        # context x this cannot fit: it is refused before the tokenizer spends memory on it.
        self._max_chars_per_token = max(map(len, vocab_entries), default=1) or 1
        self._prompt_work = ThreadPoolExecutor(PROMPT_THREADS, thread_name_prefix="prompt-work")

    def speculation_status(self) -> dict:
        """For /health: the mode, and what this entry's requests drafted (speculation.py)."""
        model = {"draft_model": self.draft_model.name} if self.draft_model is not None else {}
        return {"mode": self.speculate, **model, **self.speculation.as_dict()}

    async def off_loop(self, fn, *args):
        """fn(*args) on the prompt threads (templating, tokenizing, grammars), awaited on the loop."""
        return await asyncio.get_running_loop().run_in_executor(self._prompt_work, partial(fn, *args))

    async def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Raises PromptTooLong (checked here, before any work), or chat_prompt.TemplateRejected."""
        if len(messages) > self.context_length:
            raise PromptTooLong(f"{len(messages)} messages cannot fit this model's context of "
                                f"{self.context_length} tokens")
        self._check_chars(content_chars(messages))
        return await self.off_loop(self.encode_chat_now, messages, tools)

    def encode_chat_now(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """encode_chat on the calling thread (any thread but the event loop's)."""
        text = self.chat_prompt.render(messages, tools)
        return self._encode(text, add_special_tokens=False)  # what tokenize=True does, after our size check

    async def encode_text(self, text: str) -> list[int]:
        self._check_chars(len(text))
        return await self.off_loop(self._encode, text, True)

    def _check_chars(self, chars: int) -> None:
        if chars > self.context_length * self._max_chars_per_token:
            raise PromptTooLong(f"a prompt of {chars} characters cannot fit this model's context of "
                                f"{self.context_length} tokens")

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        self._check_chars(len(text))
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def budget(self, prompt_len: int, max_tokens: int | None) -> int:
        """Tokens this request may generate; raises ValueError when the prompt leaves no room."""
        room = self.context_length - prompt_len
        if room < 1 or (max_tokens is not None and max_tokens > room):
            wanted = max_tokens if max_tokens is not None else 1
            raise ValueError(f"this model's context is {self.context_length} tokens; the prompt has "
                             f"{prompt_len} and {wanted} more were requested")
        return max_tokens if max_tokens is not None else min(self.default_max_tokens, room)

    async def complete(self, prompt: list[int], sampling: SamplingParams, max_tokens: int, stop: list[str],
                       rules: DecodingRules | None = None, tool_calls: ToolCallOutput | None = None,
                       speculate: bool = True) -> AsyncIterator[TextDelta | PromptScores | Finished]:
        """Text events for one completion. `rules`: what the last stage's sampler applies; `tool_calls`:
        where tool calls are taken out of the text (chat with tools); `speculate`: False keeps its steps
        free of drafts (a grammar or penalties do too: speculation.py)."""
        drafting = speculate and drafts_allowed(rules)
        job = GenerationJob(uuid.uuid4().hex, prompt, sampling, max_tokens, self.eos_ids,
                            rules=replace(rules, prompt_len=len(prompt)) if rules is not None else None,
                            prefill_step=self.prefill_step,
                            speculation=request_speculation(self.speculate, self.speculation, self.draft_model,
                                                             self.word_starts)
                            if drafting else None)
        out = TextOutput(self.tokenizer, stop)
        scores: list[TokenScore] = []  # of tokens whose text has not gone out yet
        ids: list[int] = []  # tokens not yet in a delta
        reason = "length"
        with self.stats.track(job.request_id, job):
            async with aclosing(generate_tokens(job, self.get_pipeline, self.recovery_timeout)) as tokens:
                async for token in tokens:
                    self.stats.token()
                    if job.prompt_logprobs is not None and len(job.generated) == 1:
                        yield PromptScores(_scores(job.prompt_logprobs))
                    eos = token in self.eos_ids
                    if job.logprobs and not eos:
                        scores += _scores(job.logprobs[len(job.generated) - 1])  # (a step may bring several)
                    ids.append(token)
                    if delta := _delta(out.add(token, eos=eos), tool_calls, scores, ids):
                        scores, ids = [], []
                        yield delta
                    if eos or out.stopped:
                        reason = "stop"
                        break
            tail = out.finish()
            calls: list[dict] = []
            if tool_calls is not None:
                tail, more = tool_calls.add(tail) if tail else ("", [])
                rest, calls = tool_calls.finish()
                tail, calls = tail + rest, more + calls
            if tail or calls or scores or ids:
                yield TextDelta(tail, calls, scores, ids)
            if reason == "stop" and tool_calls is not None and tool_calls.count:
                reason = "tool_calls"
            yield Finished(reason, len(prompt), len(job.generated), job.route, out.stop_string)


def _delta(text: str, tool_calls: ToolCallOutput | None, scores: list[TokenScore],
           ids: list[int]) -> TextDelta | None:
    calls: list[dict] = []
    if tool_calls is not None and text:
        text, calls = tool_calls.add(text)
    if not text and not calls:
        return None
    return TextDelta(text, calls, scores, ids)


def _scores(rows: TokenLogprobs) -> list[TokenScore]:
    return [TokenScore(int(ids[0]), float(lps[0]), tuple(zip(map(int, ids[1:]), map(float, lps[1:]))))
            for ids, lps in zip(rows.ids, rows.logprobs)]
