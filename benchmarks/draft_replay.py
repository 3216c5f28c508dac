"""How far drafting can take each prompt: the entry's drafting rule replayed on mlx-lm's greedy answers, beside
what a perfect lookup would bring, each step costed by how much a pass of its width costs.

    python benchmarks/draft_replay.py [--model DIR] [--prompts free,edit,typos,names] [--tokens 64]
                                      [--variants 4] [--costs 1.24,1.41,1.56,1.58,1.62,1.66,1.73,1.84]

No node runs: mlx-lm writes each prompt's greedy answer (swarm-bench's MlxLmAlone, its prompts, cold; a
small model answers each variant's distinct first line differently, so each figure is the median over
`--variants` of them, as swarm-bench's single-stream runs 1, 2, ...). Then each step of a request is
replayed without the model: under greedy decoding a step brings its accepted drafts and the token after
them, whatever the drafts were. On one node of this machine the rule's figures came within 0.07x of
`speculation_speed.py`'s (docs/performance.md). A step with k drafts costs `--costs`[k - 1] passes of
one position (default: this repository's 2-core CPU, `verify_pass_cost.py`; on a backend where a few more
positions cost nothing, pass 1,1,...). For each prompt:

- the rule: speculation.py's PromptLookup and Speculation, as a node runs them (tokens per pass, and the
  tokens per unit of cost against steps of one position: the speed-up it can bring at best, with the
  pipeline's fixed cost per trip left out);
- aligned: a lookup that always finds the place the answer goes on from (the longest run of the answer's next
  tokens that occurred before), with the rule's draft counts (and the best fixed count), but no more foresight
  than the rule: it drafts as many tokens as its count says, and a pass pays for all of them;
- oracle: as aligned, drafting exactly the tokens that will be accepted (nothing a drafter can know).

The gap between the rule and aligned is what a better lookup could win; between aligned and oracle, what the
cost of drafts that are not accepted takes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CPU_COSTS = "1.24,1.41,1.56,1.58,1.62,1.66,1.73,1.84"  # drafts 1..8, this machine (docs/performance.md)


def longest_run(history: list[int], ahead: list[int], most: int) -> int:
    """How many of `ahead`'s first tokens (up to `most`) occur together somewhere in `history`."""
    n = 0
    while n < min(most, len(ahead)) and _occurs(history, ahead[:n + 1]):
        n += 1
    return n


def _occurs(seq: list[int], run: list[int]) -> bool:
    n = len(run)
    return any(seq[j:j + n] == run for j in range(len(seq) - n + 1))


def replay_rule(prompt: list[int], answer: list[int], word_starts, cost,
                steps: list | None = None) -> tuple[int, float]:
    """(passes, cost) of the answer's tokens after its first, drafted by the entry's own rule; each step's
    (drafts, accepted, tokens) appended to `steps` if given."""
    from swarm.entry.speculation import SpeculationCounts, request_speculation

    spec = request_speculation("lookup", SpeculationCounts(), word_starts=word_starts)
    history, i, passes, spent = list(prompt) + answer[:1], 1, 0, 0.0
    while i < len(answer):
        drafts = asyncio.run(spec.next_drafts(history, len(answer) - i - 1, False))
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == answer[i + accepted]:
            accepted += 1
        spec.checked(len(drafts), accepted)
        spec.may_run_ahead(False)
        history += answer[i:i + accepted + 1]
        if steps is not None:
            steps.append((len(drafts), accepted, answer[i:i + accepted + 1]))
        i, passes, spent = i + accepted + 1, passes + 1, spent + cost(len(drafts))
    return passes, spent


def replay_aligned(prompt: list[int], answer: list[int], cost, count: int | None, oracle: bool = False) -> float:
    """The cost of the answer's tokens after its first, drafted from the right place: `count` drafts a step
    (None: the rule's counts, kept by the entry's own Speculation), or with `oracle` exactly those that will
    be accepted."""
    from swarm.entry.speculation import MAX_DRAFTS, Speculation

    counts, i, spent = Speculation(source=lambda history, k: []), 1, 0.0
    while i < len(answer):
        room = len(answer) - i - 1
        run = longest_run(list(prompt) + answer[:i], answer[i:], MAX_DRAFTS)
        drafted = min(run if oracle else (count or counts.k), room)
        accepted = min(run, drafted)
        counts.checked(drafted, accepted)
        i, spent = i + accepted + 1, spent + cost(drafted)
    return spent


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="an mlx-lm model dir (default: the default model)")
    p.add_argument("--prompts", default="free,edit,typos,names")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--variants", type=int, default=4)
    p.add_argument("--costs", default=CPU_COSTS, help="cost of a pass with 1, 2, ... drafts, in passes of one")
    p.add_argument("--trace", action="store_true", help="also print each answer's steps: drafts/accepted:text")
    args = p.parse_args(argv)

    from swarm.backend import this_backend
    from swarm.bench.measure import MlxLmAlone
    from swarm.bench.prompts import PROMPTS, cold
    from swarm.entry.speculation import MAX_DRAFTS, word_start_tokens
    from swarm.models.resolve import resolve_model

    widths = [float(c) for c in args.costs.split(",")]
    if len(widths) < MAX_DRAFTS:
        p.error(f"--costs needs {MAX_DRAFTS} figures (1 to {MAX_DRAFTS} drafts)")

    def cost(drafts: int) -> float:
        return 1.0 if drafts == 0 else widths[drafts - 1]

    backend = this_backend()  # (mlx-lm's answers in the weights' dtype a node of this backend runs)
    alone = MlxLmAlone(args.model or resolve_model(None, backend=backend.kind).path,
                       dtype=backend.weights_dtype("auto"))
    tokenizer = alone.tokenizer
    word_starts = word_start_tokens(tokenizer.vocab)
    print(f"\ngreedy answers of {args.tokens} tokens; a pass with 1..{MAX_DRAFTS} drafts costs {args.costs} passes "
          f"of one position\n")
    print("| prompt | tokens | rule: tokens per pass | rule | aligned (rule's counts) | aligned (best fixed count) "
          "| oracle |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    traces: list[str] = []
    for kind in args.prompts.split(","):
        figures = []
        for variant in range(1, args.variants + 1):  # (swarm-bench's single-stream runs: cold(text, 1), 2, ...)
            prompt = list(tokenizer.encode(cold(PROMPTS[kind], variant)))
            answer = alone.generate(prompt, args.tokens)[0]
            n = len(answer) - 1  # the tokens after the first (the first comes with the prompt)
            if n < 1:
                continue
            steps: list = []
            passes, spent = replay_rule(prompt, answer, word_starts, cost, steps)
            if args.trace:
                traces.append(f"{kind} {variant}: "
                              + " | ".join(f"{d}/{a}:{tokenizer.decode(t)!r}" for d, a, t in steps))
            fixed = max((n / replay_aligned(prompt, answer, cost, c), c) for c in range(1, MAX_DRAFTS + 1))
            figures.append((len(answer), n / passes, n / spent, n / replay_aligned(prompt, answer, cost, None),
                            fixed, n / replay_aligned(prompt, answer, cost, None, oracle=True)))
        if not figures:
            print(f"| {kind} | 0 | - | - | - | - | - |")
            continue
        columns = list(zip(*figures))
        tokens, per_pass, rule, aligned, oracle = (statistics.median(columns[i]) for i in (0, 1, 2, 3, 5))
        fixed = statistics.median_low(columns[4])  # (a figure and its count)
        print(f"| {kind} | {tokens:.0f} | {per_pass:.2f} | {rule:.2f}x | {aligned:.2f}x | "
              f"{fixed[0]:.2f}x ({fixed[1]}) | {oracle:.2f}x |")
    for trace in traces:
        print(f"\n{trace}")


if __name__ == "__main__":
    main(sys.argv[1:])
