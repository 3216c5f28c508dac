"""A shard serving many requests, each with its own caches and position.

A request's position is counted here, not read from a cache: some cache kinds
(ArraysCache of linear-attention and state-space layers) have no offset.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx

from .constraints import GrammarVocab
from .decoding_rules import DecodingRules
from .request_sampler import HistoryMismatch, RequestSampler
from .sampling import SamplingParams, sample
from .shard import Shard
from .shard_caches import ShardCaches
from .token_logprobs import SampledToken


class CacheMismatch(Exception):
    """A frame arrived for a position this stage's cache does not hold (e.g. lost state)."""


@dataclass
class _RequestState:
    caches: ShardCaches
    offset: int = 0  # positions this request's caches hold
    last_used: float = field(default_factory=time.monotonic)
    sampler: RequestSampler | None = None  # the last stage's, for a request with decoding rules


class ShardRunner:
    """Synchronous: call only from the node's MLX worker thread."""

    def __init__(self, shard: Shard, vocab: GrammarVocab | None = None):
        self.shard = shard
        self.vocab = vocab  # for grammars (constraints.py); None: requests with one are refused
        self._requests: dict[str, _RequestState] = {}

    @property
    def range(self):
        return self.shard.range

    def forward(self, request_id: str, x: mx.array, start_pos: int, sampling: SamplingParams | None = None,
                rules: DecodingRules | None = None, ids: list[int] | None = None) -> mx.array | int | SampledToken:
        """Run positions [start_pos, start_pos + L) of a request through this shard.

        start_pos 0 always starts the request afresh (a replay after churn does that), with
        the request's decoding `rules` if it has any; every later forward of such a request
        brings the token `ids` of its positions (see request_sampler.py).
        On the last stage with `sampling`, returns the sampled token for the next position
        (a SampledToken when the rules ask for logprobs).
        """
        state = self._requests.get(request_id)
        if state is None or start_pos == 0:
            state = self._requests[request_id] = _RequestState(self.shard.make_caches())
            if rules is not None and self.range.is_last:
                try:
                    state.sampler = RequestSampler(rules, self.vocab)
                except Exception as e:  # never expected: the entry checked the rules
                    del self._requests[request_id]
                    raise CacheMismatch(f"request {request_id}: its decoding rules cannot apply here: {e}") from e
        if state.offset != start_pos:
            raise CacheMismatch(f"request {request_id}: cache holds {state.offset} positions, frame starts at {start_pos}")
        state.last_used = time.monotonic()
        sampler = state.sampler
        prepared = None
        try:
            if sampler is not None:
                sampler.observe(start_pos, ids)
            every_row = sampler is not None and sampler.wants_every_row(start_pos)
            out = self.shard(x, state.caches, every_row) if every_row else self.shard(x, state.caches)
            if sampler is not None and sampling is not None and self.range.is_last:
                prepared = sampler.prepare(out[-1] if every_row else out)  # joins the forward's evaluation
                mx.eval(out, prepared.arrays(), state.caches.arrays())
            else:
                mx.eval(out, state.caches.arrays())
        except HistoryMismatch as e:
            del self._requests[request_id]
            raise CacheMismatch(f"request {request_id}: {e}") from None
        except Exception:
            del self._requests[request_id]  # its caches may hold part of the step
            raise
        state.offset += x.shape[1]
        if every_row:
            sampler.take_prompt_rows(out, start_pos)
            out = out[-1]
        if not self.range.is_last or sampling is None:
            return out
        if prepared is not None:
            return sampler.draw(prepared, sampling, start_pos + x.shape[1])
        return sample(out, sampling, start_pos + x.shape[1])

    def decode_batch(self, items: list[tuple]) -> list:
        """One decode position for several requests in one pass (see Shard.decode_batch).

        items: (request id, input of one position, its position, sampling[, its token ids, for a
        request with decoding rules]). Returns per item what forward would, or the CacheMismatch
        that request hit (the others go on). Each row is sampled with its own request's state.
        """
        results: list = [None] * len(items)
        rows, states = [], []
        for i, (rid, x, pos, *_) in enumerate(items):
            state = self._requests.get(rid)
            if state is None or state.offset != pos or pos == 0 or x.shape[1] != 1:
                held = state.offset if state else 0
                results[i] = CacheMismatch(f"request {rid}: cache holds {held} positions, frame starts at {pos}")
                continue
            if state.sampler is not None:
                try:
                    state.sampler.observe(pos, items[i][4] if len(items[i]) > 4 else None)
                except HistoryMismatch as e:
                    del self._requests[rid]
                    results[i] = CacheMismatch(f"request {rid}: {e}")
                    continue
            state.last_used = time.monotonic()
            rows.append(i)
            states.append(state)
        if not rows:
            return results
        try:
            out = self.shard.decode_batch(mx.concatenate([items[i][1] for i in rows], axis=0),
                                          [st.caches for st in states])
            prepared = [st.sampler.prepare(out[j]) if self.range.is_last and st.sampler is not None
                        and items[i][3] is not None else None for j, (i, st) in enumerate(zip(rows, states))]
            mx.eval(out, [p.arrays() for p in prepared if p is not None], [st.caches.arrays() for st in states])
        except Exception:
            for i in rows:
                self._requests.pop(items[i][0], None)
            raise
        for st in states:
            st.offset += 1
        for j, i in enumerate(rows):
            _, _, pos, sampling, *_ = items[i]
            if not self.range.is_last:
                results[i] = out[j:j + 1]
            elif sampling is not None:
                results[i] = (states[j].sampler.draw(prepared[j], sampling, pos + 1) if prepared[j] is not None
                              else sample(out[j], sampling, pos + 1))
        return results

    def release(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def release_idle(self, max_idle_s: float) -> list[str]:
        """Free the caches of requests nobody has touched for a while (their entry died)."""
        now = time.monotonic()
        stale = [rid for rid, s in self._requests.items() if now - s.last_used > max_idle_s]
        for rid in stale:
            del self._requests[rid]
        return stale

    @property
    def active_requests(self) -> int:
        return len(self._requests)
