"""How many positions a request's next prompt chunk carries (event loop).

A prompt is read as mlx-lm reads one (prompt[:-1] in chunks, then the last token alone). Each chunk is
one whole trip through every stage, and on a CPU a small chunk's pass also costs more per position, so
a prompt that no other request of its entry waits behind goes in large chunks (`alone`, mlx-lm's
prefill_step_size): a ten-turn chat's new turn in one pass, a long prompt in few. As soon as another
request of the entry runs, the next chunk is small (`beside`): each step of that request waits at
every stage for the chunk under way there, so the large chunks it meets are those already out when it
came (a few, answered first: entry/swarm_pipeline.py), and the stages serve it before them
(stage/stage_service.py, stage/chunk_hold.py). What is left of a prompt that fits one large chunk
goes in one, beside others too: no longer a pass than the large chunks others meet anyway, and a
short chat that arrives beside a long prompt sends one frame, not several that each wait there.

A request alone from start to end gets chunks of exactly `alone` positions (the last one shorter), so
its greedy text equals mlx-lm's at prefill_step_size=`alone` (tests/reference.py); so does a prompt
that fits one large chunk, alone or not. The entry does not
see other entries' requests at its stages: a stage that serves them meets this entry's large chunks,
each at most one pass, and holds them back while its own requests decode (stage/chunk_hold.py).
"""

from __future__ import annotations


def next_chunk(remaining: int, beside: int, alone: int, is_alone: bool) -> int:
    """Positions of the next chunk of a prompt with `remaining` positions left to read before its last
    token: up to `alone` (at least `beside`) when no other request of the entry runs or what is left
    fits that, else `beside`."""
    large = max(alone, beside)
    if remaining <= large or is_alone:
        return max(0, min(remaining, large))
    return beside
