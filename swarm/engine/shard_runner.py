"""A shard serving many requests, each with its own caches and position.

A request is known by its entry (the node that started it) and its id: two entries' requests
never share caches, whatever ids they pick, so no frame can restart or free another entry's
request. What each entry may hold here is capped (cache_budget.py).

A request's position is counted here, not read from a cache: some cache kinds
(ArraysCache of linear-attention and state-space layers) have no offset.

Decode passes of several requests run on batches kept across steps (kept_batches.py) where the
shard can batch, and prompts prefilled in one pass start in that pass's batch; where each request's
caches are and what they count is held_requests.py's.

A request's entry counts its restarts (attempts: transport/messages.py, Forward): frames of an
attempt older than one seen here, or than one its entry released, are dropped (`admits`), and a
newer attempt frees the older one's caches first, so a replay never computes on stale frames.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from . import families
from .batch_rows import DecodeStep, PromptStart
from .cache_budget import CacheFull, CacheLimits
from .constraints import GrammarVocab
from .decoding_rules import DecodingRules
from .decode_ahead import StepsAhead
from .draft_check import Checked, DraftCheck, can_check_drafts
from .held_requests import HeldRequests
from .prompt_cache import PromptCacheMiss, PromptCacheStats
from .request_sampler import HistoryMismatch, RequestSampler
from .request_attempts import RequestAttempts
from .request_state import Key, RequestState
from .row_draws import RowDraws
from .sampling import SamplingParams, sample, sampled
from .shard import Shard
from .stage_prompts import StagePrompts
from .token_logprobs import SampledToken


class CacheMismatch(Exception):
    """A frame arrived for a position this stage's cache does not hold (e.g. lost state)."""


class ShardRunner:
    """Synchronous: call only from the node's MLX worker thread."""

    def __init__(self, shard: Shard, limits: CacheLimits | None = None, context: int | None = None,
                 vocab: GrammarVocab | None = None, keep_batches: bool = True, prompt_cache_bytes: int = 0,
                 decode_ahead: bool = False):
        """`decode_ahead`: a whole-model stage builds a request's next step before reading its token
        (decode_ahead.py; Backend.decode_ahead says where)."""
        self.shard = shard
        self.keep_batches = keep_batches and shard.takes_padded_batches  # False: the unrolled pass on own caches
        self.held = HeldRequests(shard, limits)  # each request's caches and what they count (held_requests.py)
        self.batches, self.budget, self._requests = self.held.batches, self.held.budget, self.held.states
        self.vocab = vocab  # for grammars (constraints.py); None: requests with one are refused
        self.context = context or 2**31 - 1
        self.input_limits = shard.input_limits(self.context)
        # caches of finished requests, reused by later ones that start with the same tokens (prompt_cache.py)
        self.prompts = StagePrompts(shard.range, 0 if shard.family in families.PIECES_MATTER else prompt_cache_bytes)
        self.ahead = StepsAhead(shard, self.budget, self.context, decode_ahead, self.held.drop)
        self.attempts = RequestAttempts()

    @property
    def range(self):
        return self.shard.range

    def forward(self, request_id: str, x: mx.array, start_pos: int, sampling: SamplingParams | None = None,
                entry: str = "", rules: DecodingRules | None = None,
                ids: list[int] | None = None, prefix: list[int] | None = None,
                drafts: list[int] | None = None) -> mx.array | int | SampledToken | Checked:
        """Run positions [start_pos, start_pos + L) of `entry`'s request through this shard.

        start_pos 0 always starts the request afresh (a replay after churn does that), with
        the request's decoding `rules` if it has any; every later forward of such a request
        brings the token `ids` of its positions (see request_sampler.py). So does a `prefix`:
        the token ids of positions [0, start_pos), whose caches the request starts from, as kept
        by `release(keep=...)` (prompt_cache.py); PromptCacheMiss if this stage does not hold them.
        On the last stage with `sampling`, returns the sampled token for the next position
        (a SampledToken when the rules ask for logprobs).
        `drafts`: the step carries draft tokens, positions [start_pos + 1, start_pos + L): the last stage draws at
        every position and returns a Checked (draft_check.py). The positions of drafts it did not accept are
        cut off on every stage when the request's next forward starts at an earlier position.
        Raises CacheMismatch when the caches do not hold start_pos, CacheFull past a cap.
        """
        key, length = (entry, request_id), x.shape[1]
        if start_pos + length > self.context:
            raise CacheMismatch(f"request {request_id}: positions [{start_pos}, {start_pos + length}) run past "
                                f"the context of {self.context}")
        if prefix is not None and len(prefix) != start_pos:
            raise CacheMismatch(f"request {request_id}: a prefix of {len(prefix)} tokens for position {start_pos}")
        if drafts is not None and (len(drafts) != length - 1 or not drafts):
            raise CacheMismatch(f"request {request_id}: {len(drafts)} drafts in a step of {length} positions")
        state = self._requests.get(key)
        if state is not None and state.ahead is not None:
            if state.ahead.serves(x, start_pos, sampling) and rules is None and prefix is None:
                state.last_used = time.monotonic()
                return self.ahead.take(key, state)
            self.ahead.settle(key, state)
        if state is not None and prefix is None and state.offset - state.drafted <= start_pos < state.offset:
            self._cut_drafts(key, state, start_pos)
        if start_pos == 0 or prefix is not None:
            if state is not None:
                self.held.drop(key)
            self.prompts.started(key)
            state = self._start(key, length, prefix)
            if rules is not None and self.range.is_last:
                try:
                    state.sampler = RequestSampler(rules, self.vocab)
                    if prefix:
                        state.sampler.observe(0, prefix)
                except Exception as e:  # never expected: the entry checked the rules
                    self.held.drop(key)
                    raise CacheMismatch(f"request {request_id}: its decoding rules cannot apply here: {e}") from e
        elif state is None or state.offset != start_pos:
            if state is None and self.prompts.missed(key):
                raise PromptCacheMiss(f"request {request_id} missed its prefix here", quiet=True)
            holds = state.offset if state else 0
            raise CacheMismatch(f"request {request_id}: cache holds {holds} positions, frame starts at {start_pos}")
        else:
            state.last_used = time.monotonic()  # (before growing, which may free idle requests)
            self.held.own(key, state)
            self.held.grow(key, state, length)
        sampler = state.sampler
        prepared = check = None
        try:
            if sampler is not None:
                sampler.observe(start_pos, ids)
            if drafts is not None and not can_check_drafts(state.caches.unique()):
                raise CacheMismatch(f"request {request_id}: this model's caches cannot drop unaccepted drafts")
            every_row = sampler is not None and sampler.wants_every_row(start_pos)
            checking = drafts is not None and sampling is not None and self.range.is_last
            out = self.shard(x, state.caches, every_row or checking)
            token = None
            if checking:
                if sampler is not None and not sampler.checks_drafts:
                    raise CacheMismatch(f"request {request_id}: its decoding rules follow every token: no drafts")
                check = DraftCheck(out, drafts, sampling, start_pos, sampler)
                mx.eval(check.arrays(), state.caches.arrays())
            elif sampler is not None and sampling is not None and self.range.is_last:
                prepared = sampler.prepare(out[-1] if every_row else out)  # joins the forward's evaluation
                mx.eval(out, prepared.arrays(), state.caches.arrays())
            elif sampling is not None and self.range.is_last and not every_row:
                token = sampled(out, sampling, start_pos + length)  # the token in the forward's evaluation
                ahead = self.ahead.wanted(state.caches)
                (mx.async_eval if ahead else mx.eval)(token, state.caches.arrays())
            else:
                mx.eval(out, state.caches.arrays())
        except HistoryMismatch as e:
            self.held.drop(key)
            raise CacheMismatch(f"request {request_id}: {e}") from None
        except Exception:
            self.held.drop(key)  # its caches may hold part of the step
            raise
        state.offset += length
        state.drafted = len(drafts) if drafts is not None else 0
        if check is not None:
            return check.result()
        if every_row:
            sampler.take_prompt_rows(out, start_pos)
            out = out[-1]
        if not self.range.is_last or sampling is None:
            return out
        if prepared is not None:
            return sampler.draw(prepared, sampling, start_pos + length)
        if token is None:
            return sample(out, sampling, start_pos + length)
        if ahead:
            self.ahead.start(key, state, token, start_pos + length, sampling)
        return self.ahead.read(state, token)

    def _cut_drafts(self, key: Key, state: RequestState, pos: int) -> None:
        """The request's last step checked drafts and goes on from `pos`: the positions past it stand for
        drafts that were not accepted, and go (mlx-lm's trim_prompt_cache, on every cache behind the slots)."""
        n = state.offset - pos
        self.held.own(key, state)
        trim_prompt_cache(state.caches.unique(), n)
        state.offset, state.drafted = pos, 0
        state.counted -= n
        self.budget.add(key[0], False, -n)
        if state.sampler is not None:
            state.sampler.forget_after(pos)

    def _start(self, key: Key, length: int, prefix: list[int] | None = None) -> RequestState:
        caches = self.prompts.start(key, prefix) if prefix else self.shard.make_caches()
        return self.held.start(key, caches, len(prefix or ()), length)

    def decode_batch(self, items: list[DecodeStep], entries: list[str] | None = None) -> list:
        """One decode position for several requests in one pass (see Shard.decode_batch).

        `entries`: each one's entry. Returns per item what forward would, or the CacheMismatch
        (CacheFull) that request hit (the others go on). Each row is sampled with its own request's
        state.
        """
        items = [DecodeStep(*item) for item in items]
        entries = entries or [""] * len(items)
        results: list = [None] * len(items)
        rows, states, keys = [], [], []
        for i, (rid, x, pos, *_) in enumerate(items):
            key = (entries[i], rid)
            state = self._requests.get(key)
            if state is not None and state.ahead is not None:
                self.ahead.settle(key, state)  # (the batch computes the step itself)
            if state is not None and pos and state.offset - state.drafted <= pos < state.offset:
                self._cut_drafts(key, state, pos)
            if state is None and self.prompts.missed(key):
                results[i] = PromptCacheMiss(f"request {rid} missed its prefix here", quiet=True)
                continue
            if state is None or state.offset != pos or pos == 0 or x.shape[1] != 1 or pos + 1 > self.context:
                holds = state.offset if state else 0
                results[i] = CacheMismatch(f"request {rid}: cache holds {holds} positions, frame starts at {pos}")
                continue
            if state.sampler is not None:
                try:
                    state.sampler.observe(pos, items[i].token_ids)
                except HistoryMismatch as e:
                    self.held.drop(key)
                    results[i] = CacheMismatch(f"request {rid}: {e}")
                    continue
            state.last_used = time.monotonic()
            try:
                self.held.grow(key, state, 1)
            except CacheFull as e:
                results[i] = e
                continue
            rows.append(i)
            states.append(state)
            keys.append(key)
        if not rows:
            return results
        try:
            batch = self.held.kept_batch(keys, states) if self.keep_batches and len(rows) > 1 else None
            if batch is None:
                for key, st in zip(keys, states):
                    self.held.own(key, st)
                out = self.shard.decode_batch(mx.concatenate([items[i].x for i in rows], axis=0),
                                              [st.caches for st in states])
                arrays = [st.caches.arrays() for st in states]
            else:  # the batch's rows are in its own order; this pass's may come in any other
                at = {key: j for j, key in enumerate(keys)}
                x = mx.concatenate([items[rows[at[key]]].x for key in batch.members], axis=0)
                row_of = {key: r for r, key in enumerate(batch.members)}
                out = self.shard.decode_kept(x, batch.caches)[mx.array([row_of[key] for key in keys])]
                arrays = batch.arrays()
            draws = RowDraws(out, [items[i] for i in rows], [st.sampler for st in states]) \
                if self.range.is_last else None
            mx.eval(out, arrays, draws.arrays() if draws else [])
        except Exception:
            for key in keys:
                self.held.drop(key)
            raise
        for st in states:
            st.offset += 1
            st.drafted = 0
        for j, i in enumerate(rows):
            results[i] = draws.token(j) if draws else out[j:j + 1]
        return results

    def prefill_batch(self, items: list[PromptStart], entries: list[str]) -> list:
        """The first chunk of several new requests' prompts as one padded pass: from position 0
        (Shard.prefill_batch), or, when any starts from a kept prefix, each after its own prefix
        (Shard.prefill_batch_after: prefixes of any lengths, 0 included, in one pass).

        Returns per item what forward would (the hidden states, on the last stage the last
        position's logits), or the CacheMismatch (CacheFull, PromptCacheMiss) that request hit.
        """
        items = [PromptStart(*item) for item in items]
        results: list = [None] * len(items)
        rows, keys = [], []
        for i, (rid, x, prefix) in enumerate(items):
            key = (entries[i], rid)
            offset = len(prefix or ())
            if offset + x.shape[1] > self.context:
                results[i] = CacheMismatch(f"request {rid}: positions [{offset}, {offset + x.shape[1]}) run past the "
                                           f"context of {self.context}")
                continue
            if key in self._requests:
                self.held.drop(key)
            self.prompts.started(key)
            try:
                self._start(key, x.shape[1], prefix)
            except (CacheFull, PromptCacheMiss) as e:
                results[i] = e
                continue
            rows.append(i)
            keys.append(key)
        if not rows:
            return results
        states = [self._requests[key] for key in keys]
        lengths = [items[i].x.shape[1] for i in rows]
        width, after = max(lengths), any(st.offset for st in states)
        pads = [width - n for n in lengths]  # each row's padding in the pass: left, or right after prefixes
        ends = [st.offset + n for st, n in zip(states, lengths)]  # positions each row holds after it
        held_pads = [max(st.offset for st in states) + width - n for n in ends]  # and its left padding in the batch
        x = mx.concatenate([mx.pad(items[i].x, [(0, 0), (0, p) if after else (p, 0)] + [(0, 0)] * (items[i].x.ndim - 2))
                            for i, p in zip(rows, pads)], axis=0)
        try:
            if after:
                out, batch = self.shard.prefill_batch_after(x, lengths, [st.caches.owned for st in states])
            else:
                out, batch = self.shard.prefill_batch(x, pads)
            keep = self.keep_batches and len(keys) > 1 and self.held.padding_fits(zip(keys, held_pads))
            own = None if keep else self.shard.rows_of(batch, len(keys))
            mx.eval(out, [(c.keys, c.values, c.offset, c.left_padding) for c in batch] if keep
                    else [c.arrays() for c in own])
        except Exception:
            for key in keys:
                self.held.drop(key)
            raise
        for j, (i, st) in enumerate(zip(rows, states)):
            st.caches, st.offset = (None if keep else own[j]), ends[j]
            if self.range.is_last:
                results[i] = out[j]
            else:
                results[i] = out[j:j + 1, :lengths[j]] if after else out[j:j + 1, pads[j]:]
        if keep:  # their decode steps come back together: the batch they were prefilled in serves them
            self.held.adopt(keys, batch)
        return results

    def admits(self, entry: str, request_id: str, attempt: int) -> bool:
        """May a frame of this attempt of `entry`'s request run? False: an older attempt's, or one its
        entry released. A newer attempt than the one held frees the older one's caches."""
        key = (entry, request_id)
        return self.attempts.admits(key, attempt, lambda: self.held.drop(key) if key in self._requests else None)

    def release(self, request_id: str, entry: str = "", keep: Sequence[int] | None = None, attempt: int = 0) -> bool:
        """Free `entry`'s request (False: it holds none by that id); frames of `attempt` or older that
        come later are dropped. `keep`: the token ids of the positions its caches hold, as its entry
        knows them (a list, or a numpy view of a frame): the caches are kept as theirs for later
        requests of that entry (prompt_cache.py)."""
        key = (entry, request_id)
        self.attempts.released(key, attempt)
        self.prompts.started(key)
        state = self._requests.get(key)
        if state is None:
            return False
        if state.ahead is not None:
            self.ahead.settle(key, state)  # (the step ahead was never asked for: its position is no token's)
        if keep is not None and 0 < len(keep) <= state.offset and self.prompts.max_bytes > 0:
            self.held.own(key, state)  # (out of a kept batch: the caches of its own rows)
            self.prompts.keep(entry, keep, state.caches, state.offset)
        self.held.drop(key)
        return True

    def prompt_stats(self) -> PromptCacheStats:
        return self.prompts.stats()

    def holders(self, request_id: str) -> list[str]:
        """The entries holding a request of this id here (for a release from someone else)."""
        return [entry for entry, rid in self._requests if rid == request_id]

    def release_idle(self, max_idle_s: float) -> list[str]:
        """Free the caches of requests nobody has touched for a while (their entry died)."""
        return self.held.release_idle(max_idle_s)

    @property
    def active_requests(self) -> int:
        return len(self._requests)

    @property
    def kv_bytes(self) -> int:
        return self.budget.kv_bytes()

