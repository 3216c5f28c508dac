"""A conversation as a chat client or agent sends it: the whole history on every turn, streamed by the
official openai client, with the time to first token of each turn. Deterministic text, greedy answers.

Used by tests/test_prompt_cache_netns.py and benchmarks/prompt_cache_turns.py.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import openai
from netns_client import in_netns

WORDS = ("river mountain garden window silver morning letter yellow travel quiet market table story "
         "winter summer bridge forest music paper station harbor lantern orchard candle meadow valley "
         "engine thunder pocket velvet marble pepper ribbon shadow island basket copper feather").split()


def paragraph(seed: int, words: int) -> str:
    rng = random.Random(seed)
    sentences, n = [], 0
    while n < words:
        k = rng.randint(6, 12)
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + ".")
        n += k
    return " ".join(sentences)


def user_turn(k: int, words: int = 110) -> str:
    """About 150 tokens of the default model's tokenizer."""
    return f"Here is note {k + 1}. {paragraph(k, words)} What is this note about?"


@dataclass
class Turn:
    ttft_s: float  # from sending the request to the first streamed text
    total_s: float
    text: str
    prompt_tokens: int
    reused: int = 0  # positions the stages started from (the entry node's stage: what its prompt cache saved)

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.reused


def stream_chat(node, messages: list[dict], max_tokens: int) -> Turn:
    """One streamed greedy chat completion from inside the node's host."""
    model = node.topology()["model"]["id"]

    def run() -> Turn:
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="none", max_retries=0, timeout=600)
        t0 = time.perf_counter()
        first, parts, usage = None, [], None
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                temperature=0, stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    first = first or time.perf_counter()
                    parts.append(choice.delta.content)
        end = time.perf_counter()
        return Turn((first or end) - t0, end - t0, "".join(parts), usage.prompt_tokens if usage else -1)
    return in_netns(node.host.ns, run)


def saved_positions(node) -> int:
    """The positions hits on the node's stage did not compute, so far (/health's prompt_cache)."""
    return node.get("/health")[1].get("prompt_cache", {}).get("tokens_saved", 0)


def conversation(node, turns: int, max_tokens: int) -> list[Turn]:
    """`turns` user turns, each sent with the whole history so far (the answers included)."""
    messages, out = [], []
    for k in range(turns):
        messages.append({"role": "user", "content": user_turn(k)})
        before = saved_positions(node)
        turn = stream_chat(node, messages, max_tokens)
        turn.reused = saved_positions(node) - before
        messages.append({"role": "assistant", "content": turn.text})
        out.append(turn)
    return out


def long_prompt(words: int = 1280) -> list[dict]:
    """One prompt of about 1,725 tokens that shares nothing with the conversation beyond the template."""
    return [{"role": "system", "content": "You answer questions about a report. " + paragraph(10_000, words)},
            {"role": "user", "content": "In one sentence, what does the report describe?"}]
