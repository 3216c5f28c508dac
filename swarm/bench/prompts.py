"""The prompts swarm-bench sends (plain completions): free text, and input-grounded tasks whose answer
quotes its input (edit a function, fix the typos in a paragraph, list the names a text mentions), where
drafts from the prompt itself are accepted most.

Every request gets a prompt of its own by default (`cold`): a node keeps finished requests' prompts
(engine/prompt_cache.py), so the same prompt twice is read once, and a time to first token of a
repeated prompt measures the cache, not the prompt. A distinct first line makes each one new to the
stages; its length varies by a token or two at most.
"""

from __future__ import annotations

FREE = (
    "The lighthouse keeper's log, autumn. The storm came in from the west just after the evening lamp was lit. "
    "By midnight the waves were breaking over the lower gallery and the glass of the lantern room rattled in its "
    "frame. I trimmed the wick twice, wound the clockwork that turns the lens, and watched for ships. Around two "
    "in the morning a small fishing boat appeared between the rocks, its single light swinging wildly. I rang the "
    "fog bell and burned a flare so the crew could see the reef. They turned north, toward the harbour, and I lost "
    "sight of them in the rain. At dawn the sea was grey and calm, as if nothing had happened. I walked down to the "
    "shore and found a wooden crate washed up on the sand. Inside it, wrapped in oilcloth, was a letter addressed "
    "to my grandfather, who kept this light fifty years ago. I sat on the rocks and opened it. The letter said"
)
PROMPT = FREE  # (the name earlier callers import)


def _function() -> str:
    """A 60-line Python function."""
    lines = ["def summarize_orders(orders, customers, rates):",
             '    """Totals per customer, in the customer\'s currency, with the largest order."""',
             "    totals = {}",
             "    largest = {}"]
    fields = ["count", "net", "tax", "shipping", "discount", "refunds", "gross", "items", "weight", "returns"]
    for k, name in enumerate(fields):
        lines += [f"    # {name}",
                  f"    for order in orders:",
                  f"        entry = totals.setdefault(order.customer_id, {{}})",
                  f"        entry['{name}'] = entry.get('{name}', 0) + order.{name} * rates.get(order.currency, 1.0)",
                  f"        if order.{name} > largest.get(order.customer_id, 0):",
                  f"            largest[order.customer_id] = order.{name}"]
    lines += ["    return {c: (totals.get(c.id, {}), largest.get(c.id)) for c in customers}"]
    return "\n".join(lines[:60])


EDIT = ("Rename the variable `totals` to `per_customer` in this function and change nothing else.\n\n"
        + _function() + "\n\nThe function with `totals` renamed to `per_customer`:\n\n")

TYPOS = ("Fix the spelling mistakes in this paragraph and change nothing else.\n\nOriginal:\n"
         "The comittee met on wendesday to dicsuss the new libary budjet. Most membres agreed that the "
         "reading room needs beter lighting and that the childrens section should recieve more books. "
         "The treasurer explaned that the grant from the city will be payed in two parts, the first in "
         "Febuary and the secound in Agust. Several neighbours wrote letters in suport of longer opening "
         "ours on the weekend, and the comittee promissed to anwser each of them before the next meeting.\n\n"
         "Corrected:\n")

NAMES = ("List every person named in this text, one per line, in the order they appear.\n\n"
         "When Maria Okafor opened the bakery on Elm Street, her cousin Daniel Reyes lent her the first oven. "
         "Within a year she hired Tomasz Nowak to run the morning shift and Aiko Tanaka to keep the books. "
         "The mayor, Helen Brooks, came to the first anniversary, and the local paper sent Samuel Adeyemi to "
         "write about it. Years later Maria's daughter, Lucia Okafor, took over, and Daniel's son Marco Reyes "
         "built the new counter. The regulars still ask for Grace Lindqvist, who baked the rye bread for "
         "twenty years before she retired to the coast with her husband, Peter Lindqvist.\n\n"
         "The people named, one per line:\n\n")

PROMPTS = {"free": FREE, "edit": EDIT, "typos": TYPOS, "names": NAMES}
INPUT_GROUNDED = ("edit", "typos", "names")


def cold(text: str, k: int | str) -> str:
    """The k-th distinct variant of a prompt: a first line of its own, so no node holds it yet."""
    return f"Request {k}.\n{text}"
