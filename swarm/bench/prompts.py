"""The prompts swarm-bench sends (plain completions): free chat, and tasks whose answer is grounded in
the prompt's own text (an edit of a function, typos fixed in a paragraph, the names a text mentions),
where an answer quotes its input (what prompt-lookup speculation feeds on).

Each run gets its own copy (`cold`): a distinct first word, so no stage's prompt cache holds any of it
and the time to first token is a cold prompt's; a warm figure repeats one copy on purpose.
"""

from __future__ import annotations

CHAT = (
    "The lighthouse keeper's log, autumn. The storm came in from the west just after the evening lamp was lit. "
    "By midnight the waves were breaking over the lower gallery and the glass of the lantern room rattled in its "
    "frame. I trimmed the wick twice, wound the clockwork that turns the lens, and watched for ships. Around two "
    "in the morning a small fishing boat appeared between the rocks, its single light swinging wildly. I rang the "
    "fog bell and burned a flare so the crew could see the reef. They turned north, toward the harbour, and I lost "
    "sight of them in the rain. At dawn the sea was grey and calm, as if nothing had happened. I walked down to the "
    "shore and found a wooden crate washed up on the sand. Inside it, wrapped in oilcloth, was a letter addressed "
    "to my grandfather, who kept this light fifty years ago. I sat on the rocks and opened it. The letter said"
)
PROMPT = CHAT  # (the free-chat prompt, as callers knew it)

_FUNCTION = "\n".join([
    "def summarize_orders(orders, currency='EUR'):",
    "    \"\"\"Totals, counts and the largest order per customer.\"\"\"",
    "    totals = {}",
    "    counts = {}",
    "    largest = {}",
    "    skipped = 0",
    "    for order in orders:",
    "        customer = order.get('customer')",
    "        if customer is None:",
    "            skipped += 1",
    "            continue",
    "        amount = order.get('amount', 0)",
    "        if order.get('currency', currency) != currency:",
    "            rate = order.get('rate')",
    "            if rate is None:",
    "                skipped += 1",
    "                continue",
    "            amount = amount * rate",
    "        if amount < 0:",
    "            skipped += 1",
    "            continue",
    "        totals[customer] = totals.get(customer, 0) + amount",
    "        counts[customer] = counts.get(customer, 0) + 1",
    "        if customer not in largest or amount > largest[customer]:",
    "            largest[customer] = amount",
    "    report = []",
    "    for customer in sorted(totals):",
    "        total = totals[customer]",
    "        count = counts[customer]",
    "        average = total / count",
    "        report.append({",
    "            'customer': customer,",
    "            'total': round(total, 2),",
    "            'count': count,",
    "            'average': round(average, 2),",
    "            'largest': round(largest[customer], 2),",
    "        })",
    "    if not report:",
    "        return {'customers': [], 'skipped': skipped, 'grand_total': 0}",
    "    grand_total = 0",
    "    for row in report:",
    "        grand_total += row['total']",
    "    best = report[0]",
    "    for row in report:",
    "        if row['total'] > best['total']:",
    "            best = row",
    "    worst = report[0]",
    "    for row in report:",
    "        if row['total'] < worst['total']:",
    "            worst = row",
    "    return {",
    "        'customers': report,",
    "        'skipped': skipped,",
    "        'grand_total': round(grand_total, 2),",
    "        'best': best['customer'],",
    "        'worst': worst['customer'],",
    "        'currency': currency,",
    "    }",
    "",
    "",
])

EDIT = ("Rename the variable `totals` to `sums` in this Python function, change nothing else, and write the "
        "whole function again.\n\n```python\n" + _FUNCTION + "```\n\nThe function with `sums`:\n\n```python\n")

TYPOS = (
    "Fix the spelling mistakes in this paragraph and write it out again, otherwise unchanged.\n\n"
    "The comittee met on Tuesday to discuss the new libary budget. Most members agred that the old building "
    "needed a new roof befor winter, but there was a long arguement about whether the reading room should be "
    "painted as well. The treasurer explaned that the grant from the city would only cover nessesary repairs, "
    "and that any other work would have to wait untill next year. After a short brake, the chairman sugested "
    "that volunteers could do the painting themselfs on a weekend in October. Everyone aggreed, and the meeting "
    "ended with a vote of thanks to the librarian for her patiance during the long renovations.\n\n"
    "The paragraph without mistakes:\n\n"
)

NAMES = (
    "List every person's name this text mentions, one per line, in the order they appear.\n\n"
    "When Margaret Holloway opened the bakery on Elm Street, her first customer was Tomas Rivera, who bought "
    "two loaves and a jar of plum jam. A week later Ingrid Solberg, the schoolteacher, ordered forty buns for "
    "the spring fair, and her brother Anders Solberg delivered them in his van. By summer the bakery was busy: "
    "Dr. Priya Raman came every Saturday, Father O'Connell sent the choir for cinnamon rolls, and old Walter "
    "Briggs sat by the window each morning with a coffee and the newspaper. In autumn Margaret hired Lucia "
    "Fernandes and Kenji Watanabe to help with the ovens, and the mayor, Helen Achebe, cut the ribbon on the "
    "new café next door.\n\nThe names:\n\n"
)

PROMPTS = {"chat": CHAT, "edit": EDIT, "typos": TYPOS, "names": NAMES}
GROUNDED = ("edit", "typos", "names")  # the answers quote their input

_FIRST_WORDS = ("Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel", "India", "Juliet", "Kilo",
                "Lima", "Mike", "November", "Oscar", "Papa", "Quebec", "Romeo", "Sierra", "Tango", "Uniform",
                "Victor", "Whiskey", "Xray", "Yankee", "Zulu")


def cold(text: str, i: int) -> str:
    """Copy `i` of a prompt: a first word of its own (a prompt cache keeps nothing of it from another copy)."""
    word = _FIRST_WORDS[i % len(_FIRST_WORDS)]
    return f"{word} {i // len(_FIRST_WORDS)}: {text}" if i >= len(_FIRST_WORDS) else f"{word}: {text}"
