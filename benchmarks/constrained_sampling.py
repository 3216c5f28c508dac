"""What decoding rules cost on the last stage, per generated token, on a real model.

    python benchmarks/constrained_sampling.py [--model DIR] [--tokens 48] [--rounds 3]

Runs the whole model as one last stage (ShardRunner, in this process) and generates
with each kind of rules the API makes: none (plain sampling), a JSON schema, a forced
tool call, tool_choice auto (lazy grammar), logprobs with 0 / 5 / 20 alternatives,
penalties with logit bias, and all of them at once. Rounds alternate the kinds so
the machine's drift spreads over all of them. Prints, per kind, the median decode
step (the forward with the rules in its evaluation, the grammar's mask, the draw)
and what it adds to a plain step. Then what rebuilding a request's sampler costs a
new last stage after churn (rules + N tokens of history replayed).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

from benchmarks.last_stage_setup import model_and_prompt, parse_args  # noqa: E402
from swarm.engine import request_sampler  # noqa: E402
from swarm.engine.constraints import GrammarVocab  # noqa: E402
from swarm.engine.decoding_rules import DecodingRules  # noqa: E402
from swarm.engine.sampling import SamplingParams  # noqa: E402
from swarm.engine.shard import load_shard  # noqa: E402
from swarm.engine.shard_runner import ShardRunner  # noqa: E402
from swarm.entry.grammars import (forced_tool_calls_grammar, json_schema_grammar, lazy_tool_calls_grammar,  # noqa: E402
                                  tool_call_schema)

PERSON = {"type": "object", "required": ["name", "age", "bio"], "additionalProperties": False,
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                         "bio": {"type": "string", "maxLength": 400}}}
WEATHER = tool_call_schema("get_weather", {"type": "object", "required": ["city"],
                                           "properties": {"city": {"type": "string", "maxLength": 200}}})


def kinds(vocab: GrammarVocab) -> dict[str, DecodingRules | None]:
    return {
        "plain": None,
        "json_schema": DecodingRules(grammar=json_schema_grammar(PERSON)),
        "tool call (forced)": DecodingRules(grammar=forced_tool_calls_grammar([WEATHER], vocab, False)),
        "tool_choice auto": DecodingRules(grammar=lazy_tool_calls_grammar([WEATHER], vocab, False)),
        "logprobs, 0 alternatives": DecodingRules(logprobs=0),
        "logprobs, top 5": DecodingRules(logprobs=5),
        "logprobs, top 20": DecodingRules(logprobs=20),
        "penalties + logit_bias": DecodingRules(presence_penalty=0.5, frequency_penalty=0.5,
                                                logit_bias=tuple((t, 1.0) for t in range(100, 400))),
        "all of them": DecodingRules(grammar=json_schema_grammar(PERSON), logprobs=5, presence_penalty=0.5,
                                     frequency_penalty=0.5, logit_bias=((100, 1.0),)),
    }


class SamplerClock:
    """Times RequestSampler.prepare and .draw (host work outside the forward's evaluation) per step."""

    def __init__(self):
        self.spent = 0.0
        for name in ("prepare", "draw"):
            original = getattr(request_sampler.RequestSampler, name)

            def timed(sampler, *args, _original=original):
                t0 = time.perf_counter()
                try:
                    return _original(sampler, *args)
                finally:
                    self.spent += time.perf_counter() - t0
            setattr(request_sampler.RequestSampler, name, timed)


CLOCK: SamplerClock | None = None


def generate(runner: ShardRunner, prompt: list[int], rules: DecodingRules | None, n: int,
             rid: str) -> list[tuple[float, float]]:
    """(step, sampler) times (s) of one request's decode steps, prefill excluded."""
    rules = None if rules is None else DecodingRules(**{**vars(rules), "prompt_len": len(prompt)})
    sampling = SamplingParams(temperature=0.0)
    token = runner.forward(rid, mx.array([prompt]), 0, sampling, rules=rules, ids=prompt if rules else None)
    token = token if isinstance(token, int) else token.token
    steps, pos = [], len(prompt)
    for _ in range(n):
        CLOCK.spent = 0.0
        t0 = time.perf_counter()
        out = runner.forward(rid, mx.array([[token]]), pos, sampling, ids=[token] if rules else None)
        steps.append((time.perf_counter() - t0, CLOCK.spent))
        token, pos = (out if isinstance(out, int) else out.token), pos + 1
    runner.release(rid)
    return steps


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], tokens=48)
    model_dir, tokenizer, prompt = model_and_prompt(args.model)
    vocab = GrammarVocab(tokenizer)
    t0 = time.perf_counter()
    vocab.ll  # noqa: B018  (built once per node, on first use)
    print(f"model {model_dir.name}: vocabulary {len(tokenizer.get_vocab())}; llguidance's view of it built in "
          f"{(time.perf_counter() - t0) * 1e3:.0f} ms (once per node)")
    runner = ShardRunner(load_shard(model_dir, 0, None, mx.float32 if not mx.metal.is_available() else None), vocab=vocab)
    global CLOCK
    CLOCK = SamplerClock()
    table = kinds(vocab)
    steps: dict[str, list[float]] = {k: [] for k in table}
    generate(runner, prompt, None, 4, "warm")
    for r in range(args.rounds):
        for name, rules in table.items():
            steps[name] += generate(runner, prompt, rules, args.tokens, f"{name}-{r}")
    base = statistics.median(t for t, _ in steps["plain"])
    print(f"\n{'rules':<26} {'step ms':>8} {'sampler µs':>11} {'% of a plain step':>18}")
    for name in table:
        step, host = statistics.median(t for t, _ in steps[name]), statistics.median(h for _, h in steps[name])
        print(f"{name:<26} {step * 1e3:8.2f} {host * 1e6:11.0f} {host / base * 100:18.2f}")
    print(f"(medians over {args.rounds} rounds x {args.tokens} decode steps, greedy; 'sampler' is the host time of "
          "RequestSampler.prepare + draw in a step (mask fill, processors, logprob rows), which the step's other "
          "work does not hide; what they add inside the forward's evaluation is in 'step', as noisy as the machine)")
    print(f"\n{'rebuild after churn':<26} {'history':>8} {'ms':>8}")
    unbounded = {**PERSON, "properties": {**PERSON["properties"], "bio": {"type": "string"}}}  # fits any history
    rules = DecodingRules(prompt_len=len(prompt), grammar=json_schema_grammar(unbounded), presence_penalty=0.5,
                          logprobs=5)
    generated = tokenizer.encode('{"name": "Ada Lovelace", "age": 36, "bio": "' + "mathematician, " * 1200,
                                 add_special_tokens=False)
    for n in (0, 64, 512, 2048):
        assert n <= len(generated), "the history to replay is shorter than asked"
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            s = request_sampler.RequestSampler(rules, vocab)
            s.observe(0, prompt + generated[:n])
            s.matcher.allowed()
            times.append(time.perf_counter() - t0)
        print(f"{'grammar + penalties':<26} {n:>8} {statistics.median(times) * 1e3:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
