"""How long a stage leaves new requests' prompts queued, for more to share their pass (MLX thread only).

Only while the queue holds nothing but new requests (their prompt chunks and the last tokens queued
behind them) and the batch is not full; other work waiting ends it.
- The first stage: a burst (an agent's parallel calls, a benchmark's clients) reaches the entry over
  a few ms. An idle first stage that started the first prompt's pass alone the moment it came would
  make the rest wait out that pass, and the first row's caches would then have to join theirs for
  the decode steps. So it waits as long as prompts keep coming `gap_s` apart (`--prompt-gather`),
  MAX_GAPS times that at most: a prompt alone pays one gap.
- A later stage: a pass's prompts reach it side by side, but a frame of hidden states is MBs, so the
  first one in would start its pass alone while the rest were on the wire, then the next, one by
  one. Each carries how many were sent with it (Forward.together): it waits for them, TOGETHER_WAIT_S
  at most (one lost with its sender, say).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from ..transport.messages import Forward, Message

MAX_GAPS = 8  # a first stage's gather lasts this many of its gaps at most
TOGETHER_WAIT_S = 1.0  # a later stage waits this long at most for the prompts a pass sent side by side


def is_new_prompt(message) -> bool:
    """A new request's first prompt chunk, from position 0 or from a kept prefix (Forward.prefix), nothing
    sampled, no decoding rules: may share a padded pass."""
    return (isinstance(message, Forward) and message.sampling is None and message.rules is None
            and ((message.pos == 0 and message.length > 1) or message.prefix is not None))


class PromptGather:
    def __init__(self, gap_s: float) -> None:
        self.gap_s = gap_s
        self._since: float | None = None  # when the first new prompt of this gather was queued
        self._last = 0.0  # and the latest

    def queued(self, message: Message) -> None:
        """`message` was queued for our stage."""
        if is_new_prompt(message):
            self._last = time.monotonic()
            if self._since is None:
                self._since = self._last

    def served(self) -> None:
        """The queue was served: what comes next starts a new gather."""
        self._since = None

    def wait_until(self, queue: Iterable[tuple[str, Message]], first_stage: bool, max_batch: int) -> float | None:
        """When to look at the queue again (time.monotonic) instead of serving it now; None: serve now."""
        since = self._since
        if since is None or max_batch < 2:
            return None
        prompts, new, together = 0, set(), 0
        for _, message in queue:
            if is_new_prompt(message):
                prompts += 1
                new.add((message.entry, message.rid))
                together = max(together, message.together)
            elif not (isinstance(message, Forward) and (message.entry, message.rid) in new):
                return None  # other work waits: go
        if prompts == 0 or prompts >= max_batch:
            return None
        if first_stage:
            until = min(self._last + self.gap_s, since + MAX_GAPS * self.gap_s)
        elif prompts < together:
            until = since + TOGETHER_WAIT_S
        else:
            return None
        return until if time.monotonic() < until else None
