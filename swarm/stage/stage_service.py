"""The stage: the frames for this node's layers, queued, batched, computed and sent on. MLX thread.

The node's inbox (node/inbox.py) hands over every Forward a sender may send this node, and
every Release (`mlx_take`); the forwards are computed after each round of socket events and
the result sent on by the lane. A frame from the right sender that this stage
cannot serve (another plan, token ids outside the vocabulary, positions past the context, the
wrong width, a cap on cached requests: engine/input_limits.py, engine/cache_budget.py) earns
its entry an Error saying why. Never a crash, never a silent divergence.

Every forward this node sends, its own requests' steps included, goes through
`mlx_send_or_fail`: a send that fails becomes an Error for the request's entry, however the
forward got here; and a link that breaks tells the entries of the requests it carried
(link_requests.py).

Frames for our stage are computed in arrival order, which also keeps each request's
frames in order downstream. Different requests still overlap across nodes: while we
compute one request, the next stage computes another. Two exceptions, for long prompts (read
in chunks: entry/generate.py): after a chunk of a prompt, what other requests queued goes
before that request's next frames; and while other requests decode, a prompt's later chunks
wait a moment for their steps (chunk_hold.py). So a long prompt holds a short request or a
decode step back little more than the chunk under way. The last stage answers each prompt chunk with a Token of its end position (no token
drawn): the entry sends the next chunks as these come, and its deadline follows them.

A Release is served the moment it comes: frames of that request still queued, and any that
come later of the attempt it names or older ones (a replay's earlier attempt), are dropped
(engine/request_attempts.py), so a request whose client has gone stops at the chunk
under way.

Decode steps of different requests that queued up while we computed run as one pass,
up to max_batch (`--batch-decode`, 16 by default): the weights are read once for all of
them, which is what bounds decode speed; their caches stay one batch across steps while the same
requests come back together (engine/kept_batches.py). A step with nothing queued beside it runs
alone through the model's own forward, so a request alone stays exactly one machine's;
batched rows may differ from a lone request's in the last bits (docs/architecture.md, Batched decode).
New requests' first prompt chunks queued together run as one padded pass the same way
(ShardRunner.prefill_batch), those that start from kept prefixes of any lengths beside those that
start cold, taken from anywhere in the queue as long as nothing of their own request was queued
before them; an idle stage waits a moment for more of them (prompt_gather.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

from ..engine.batch_rows import DecodeStep, PromptStart
from ..engine.cache_budget import CacheFull
from ..engine.prompt_cache import PromptCacheMiss
from ..engine.shard import LayerRange
from ..engine.shard_runner import CacheMismatch, ShardRunner
from ..engine.draft_check import Checked
from ..engine.token_logprobs import SampledToken
from ..engine.worker import MlxWorker
from ..transport.arrays import encode_array
from ..transport.errors import PeerUnreachable, ProtocolError
from ..transport.lane import DataLane
from ..transport.log_limit import LogLimiter
from ..transport.messages import Error, Forward, Release, Token
from .chunk_hold import ChunkHold
from .link_requests import LinkRequests
from .prompt_gather import PromptGather, is_new_prompt
from .stage_host import StageHost

log = logging.getLogger(__name__)
refused_log = logging.getLogger("swarm.refused")

IDLE_CACHE_S = 600.0  # caches of a request nobody touched this long are freed (its entry died)
GC_EVERY_S = 60.0
PROMPT_BATCH_POSITIONS = 2048  # padded positions of one prompt pass (its attention scores grow with the square)
# positions the rows of one prompt pass hold after it, kept prefixes and padding included (a pass of rows
# after kept prefixes aligns the prefixes' ends: each row holds the longest prefix plus the widest rest)
PROMPT_BATCH_HELD = 16384
LOG_EVERY_S = 10.0  # a flood of bad frames or failing requests: one line per kind this often, with a count


class StageService:
    def __init__(self, host: StageHost, lane: DataLane, worker: MlxWorker, max_batch: int = 1,
                 prompt_gather_s: float = 0.0):
        self.host, self.lane, self.worker, self.max_batch = host, lane, worker, max_batch
        self.gather = PromptGather(prompt_gather_s)  # `--prompt-gather`; MLX thread only
        self.hold = ChunkHold()  # MLX thread only
        self.node_id = lane.node_id
        self.refusals = LogLimiter(refused_log)  # frames from senders that may not send them (node/inbox.py too)
        self.failures = LogLimiter(log, logging.INFO)  # requests this stage could not serve
        self.batched_passes = 0  # passes that ran more than one request's decode step
        self.batched_rows = 0
        self.prompt_passes = 0  # passes that ran more than one request's first prompt chunk
        self.prompt_rows = 0
        # (sender, message) for our stage, in arrival order; MLX thread only
        self._queue: deque[tuple[str, Forward | Release]] = deque()
        self.carried = LinkRequests(self.node_id)  # whose entry to tell when a link breaks; MLX thread only
        self._last_gc = time.monotonic()
        # told of every pass (layers, positions, rows, seconds): node/speed_follower.py; MLX thread
        self.on_pass: Callable[[LayerRange, int, int, float], None] | None = None

    def start(self) -> None:
        """Compute what is queued after each round of socket events, from now on."""
        self.worker.after_events(self._mlx_serve_queue)

    # -- MLX thread: what the node's inbox hands over ----------------------------------------
    def mlx_take(self, sender: str, message: Forward | Release) -> None:
        """Queue a Forward its sender may send us for our stage; serve a Release (it frees the sender's
        own request only) at once."""
        if isinstance(message, Release):
            self._mlx_release(sender, message)
            key = (sender, message.rid)
            self.hold.forget(key)
            if any(isinstance(m, Forward) and (m.entry, m.rid) == key for _, m in self._queue):
                self._queue = deque(item for item in self._queue
                                    if not (isinstance(item[1], Forward) and (item[1].entry, item[1].rid) == key))
            return
        self._queue.append((sender, message))
        self.gather.queued(message)

    def mlx_link_broken(self, peer: str, problem: str) -> None:
        """The link to `peer` broke: frames we sent on it may be lost, so their requests' entries replay
        now (link_requests.py) instead of waiting out their token timeout."""
        for rid, entry, plan_id, attempt in self.carried.broken(peer):
            self._mlx_fail_request(rid, plan_id, entry, "link",
                                   f"the link from {self.node_id} to {peer} broke ({problem}): a frame may be lost",
                                   attempt)

    def _mlx_refuse(self, sender: str, what: str, why: str) -> None:
        self.refusals.every(sender, LOG_EVERY_S, "refused %s from %s: %s", what, sender, why)

    # -- MLX thread -------------------------------------------------------------------------
    def mlx_send_or_fail(self, node_id: str, forward: Forward) -> bool:
        """Send `forward` to `node_id`; if it cannot be, its entry gets an Error. True: it was sent."""
        try:
            self.lane.mlx_send(node_id, forward)
        except PeerUnreachable as e:
            self._mlx_fail(forward, "unreachable", str(e))
            return False
        self.carried.note(node_id, forward)
        return True

    def _mlx_fail(self, forward: Forward, kind: str, message: str) -> None:
        self._mlx_fail_request(forward.rid, forward.plan_id, forward.entry, kind, message, forward.attempt)

    def _mlx_fail_request(self, rid: str, plan_id: str, entry: str, kind: str, message: str,
                          attempt: int = 0) -> None:
        self.failures.every(("failed", kind), LOG_EVERY_S, "request %s of %s: %s (%s)", rid, entry, kind,
                            message)
        try:
            self.lane.mlx_send(entry, Error(rid, plan_id, kind, message, attempt))
        except PeerUnreachable:
            pass  # the entry node is gone too; its clients are gone with it

    def _mlx_serve_queue(self) -> None:
        """Compute every message queued for our stage (called after each round of socket events),
        taking in what arrived meanwhile between passes."""
        runner = self.host.runner
        if runner is not None and runner.shard.takes_padded_batches:  # (only a pass of several prompts is worth a wait)
            until = self.gather.wait_until(self._queue, runner.range.start == 0, self.max_batch)
            if until is not None:
                self.worker.mlx_recheck_at(until)
                return
        while self._queue and not self.worker.closed:  # (a node stopping computes no more)
            until = self._held_chunks_behind()
            if until is not None:
                self.worker.mlx_recheck_at(until)
                break
            sender, message = self._queue.popleft()
            try:
                t0 = time.monotonic()
                self._mlx_forward(self._with_queued_prompts(sender, message) if is_new_prompt(message)
                                  else self._with_queued_decode_steps(message))
                self.hold.served(message, time.monotonic() - t0)
                if message.sampling is None and message.length > 1:
                    self._let_others_first((message.entry, message.rid))
            except Exception:
                self.failures.every(("bug", type(message).__name__), LOG_EVERY_S, "failed to serve a %s message "
                                    "from %s", type(message).__name__, sender, exc_info=True)
            if self._queue:  # on a node that is its own next stage a request's steps follow each other on
                self.worker.mlx_take_in()  # this thread: new requests' prompts would wait for its stream to end
        self.gather.served()  # (what came meanwhile was served in this run too)
        now = time.monotonic()
        if now - self._last_gc > GC_EVERY_S and self.host.runner is not None:
            self._last_gc = now
            self.host.runner.release_idle(IDLE_CACHE_S)

    def _held_chunks_behind(self) -> float | None:
        """Put prompt chunks that are held (chunk_hold.py) behind other requests' frames; when nothing but
        held chunks is queued, when to look again."""
        earliest = None
        for _ in range(len(self._queue)):
            head = self._queue[0][1]
            until = self.hold.until(head)
            if until is None:
                return None
            earliest = until if earliest is None else min(earliest, until)
            if not self._let_others_first((head.entry, head.rid)):
                return earliest
        return earliest

    def _let_others_first(self, key: tuple[str, str]) -> bool:
        """A prompt chunk of request `key` was computed: what other requests queued goes before its next
        frames (each request's own order kept). False: nothing else is queued."""
        queue = self._queue
        if not queue or not _of(queue[0][1], key):
            return True
        others = [item for item in queue if not _of(item[1], key)]
        if others:
            self._queue = deque(others + [item for item in queue if _of(item[1], key)])
        return bool(others)

    def _mlx_release(self, sender: str, message: Release) -> None:
        runner = self.host.runner
        if runner is None or runner.release(message.rid, sender, message.kept_ids(), message.attempt):
            self.carried.forget(message.rid)
            return
        holders = runner.holders(message.rid)
        if holders:  # (none: a stage that never saw the request, or already freed it: normal)
            self._mlx_refuse(sender, f"a release of request {message.rid}",
                             f"only its entry ({', '.join(holders)}) may free it")

    def _with_queued_decode_steps(self, first: Forward) -> list[Forward]:
        """`first`, plus the decode steps queued right behind it, up to max_batch.

        Only consecutive messages from the head of the queue: nothing overtakes one it was
        queued behind, so each request's steps keep their order.
        """
        steps = [first]
        if self.max_batch < 2 or not first.is_decode_step:
            return steps
        queued, requests = self._queue, {(first.entry, first.rid)}
        while len(steps) < self.max_batch and queued:
            nxt = queued[0][1]
            if not (isinstance(nxt, Forward) and nxt.is_decode_step
                    and (nxt.dtype, nxt.shape) == (first.dtype, first.shape) and (nxt.entry, nxt.rid) not in requests):
                break
            requests.add((nxt.entry, nxt.rid))
            steps.append(queued.popleft()[1])
        return steps

    def _with_queued_prompts(self, sender: str, first: Forward) -> list[Forward]:
        """`first`, a new request's first prompt chunk, plus the first chunks of other new requests
        queued behind it, up to max_batch, PROMPT_BATCH_POSITIONS padded positions and PROMPT_BATCH_HELD
        positions held after the pass.

        Prompts may overtake other requests' messages (an entry queues each prompt's last token
        right behind it), never a message of their own request: each request's order is kept.
        """
        steps = [first]
        if self.max_batch < 2 or self.host.runner is None or not self.host.runner.shard.takes_padded_batches:
            return steps
        seen, width, prefix = {(first.entry, first.rid)}, first.length, first.pos
        kept: deque = deque()
        while self._queue and len(steps) < self.max_batch:
            item = self._queue.popleft()
            by, nxt = item
            key = (nxt.entry, nxt.rid) if isinstance(nxt, Forward) else (by, nxt.rid)
            rows, wider = len(steps) + 1, max(width, nxt.length) if isinstance(nxt, Forward) else width
            if (key not in seen and is_new_prompt(nxt) and (nxt.dtype, nxt.shape[2:]) == (first.dtype, first.shape[2:])
                    and wider * rows <= PROMPT_BATCH_POSITIONS
                    and (max(prefix, nxt.pos) + wider) * rows <= PROMPT_BATCH_HELD):
                width, prefix = wider, max(prefix, nxt.pos)
                steps.append(nxt)
            else:
                kept.append(item)
            seen.add(key)
        kept.extend(self._queue)
        self._queue = kept
        return steps

    def _mlx_forward(self, steps: list[Forward]) -> None:
        runner, plan, index = self.host.runner, self.host.plan, self.host.stage_index()
        accepted = [f for f in steps if self._mlx_accept(f, runner, plan)]
        if not accepted:
            return
        prompts = is_new_prompt(accepted[0])
        if len(accepted) == 1 or not (runner.shard.takes_padded_batches if prompts else runner.shard.unrolls_decode):
            for forward in accepted:
                out, took_s = _compute(runner, forward)
                if self.on_pass is not None:
                    self.on_pass(runner.range, forward.length, 1, took_s)
                self._mlx_deliver(forward, out, took_s, runner, plan, index)
            return
        together = 0
        outs = _compute_together(runner, accepted, prompts)
        if self.on_pass is not None and outs:
            self.on_pass(runner.range, max(f.length for f in accepted), len(accepted), outs[0][1])
        if prompts:
            self.prompt_passes += 1
            self.prompt_rows += len(accepted)
            together = sum(1 for out, _ in outs if not isinstance(out, Exception))  # what goes on side by side
        else:
            self.batched_passes += 1
            self.batched_rows += len(accepted)
        with self.lane.mlx_sending_together():
            for forward, (out, took_s) in zip(accepted, outs):
                self._mlx_deliver(forward, out, took_s, runner, plan, index, together)

    def _mlx_accept(self, forward: Forward, runner: ShardRunner | None, plan) -> bool:
        """Can our stage serve it? If not, its entry is told (the sender was one that may send it); a frame
        of an attempt its entry left behind is dropped without a word."""
        if runner is not None and not runner.admits(forward.entry, forward.rid, forward.attempt):
            return False
        if plan is None or runner is None or forward.plan_id != plan.plan_id or forward.start != runner.range.start:
            self._mlx_fail(forward, "plan_mismatch",
                           f"node {self.node_id} serves plan {self.host.plan_id} layers "
                           f"{runner.range.start if runner else None}, not {forward.plan_id} layer {forward.start}")
            return False
        why = runner.input_limits.refusal(forward.pos, forward.shape, forward.payload)
        if why is not None:
            self._mlx_fail(forward, "protocol", f"node {self.node_id} refused layer {forward.start}'s input: {why}")
            return False
        return True

    def _mlx_deliver(self, forward: Forward, out, took_s: float, runner: ShardRunner, plan, index: int,
                     together: int = 0) -> None:
        if isinstance(out, PromptCacheMiss):
            if not out.quiet:  # (a later frame of a request whose entry already knows it missed)
                self._mlx_fail(forward, "prompt_cache_miss", f"node {self.node_id}: {out}")
            return
        if isinstance(out, (CacheMismatch, CacheFull, ProtocolError)):
            kind = "protocol" if isinstance(out, ProtocolError) else "cache"
            self._mlx_fail(forward, kind, f"node {self.node_id}: {out}" if isinstance(out, CacheFull) else str(out))
            return
        compute_us = forward.compute_us + round(took_s * 1e6)
        if runner.range.is_last:
            at = forward.pos + forward.length
            if forward.sampling is None:  # a prompt chunk read: its entry may send the next (no token drawn)
                token = Token(forward.rid, forward.plan_id, at, 0, compute_us, None, forward.attempt)
            elif isinstance(out, Checked):  # a step that checked drafts
                token = Token(forward.rid, forward.plan_id, at, out.token, compute_us, out.logprobs, forward.attempt,
                              out.accepted)
            elif isinstance(out, SampledToken):
                token = Token(forward.rid, forward.plan_id, at, out.token, compute_us, out.logprobs, forward.attempt)
            else:
                token = Token(forward.rid, forward.plan_id, at, out, compute_us, None, forward.attempt)
            try:
                self.lane.mlx_send(forward.entry, token)
            except PeerUnreachable as e:
                log.info("request %s: its token could not reach entry %s (%s)", forward.rid, forward.entry, e)
            return
        nxt = plan.stages[index + 1]
        self.mlx_send_or_fail(nxt.node_id, forward.onward(nxt.start, out, compute_us, together))


def _of(message, key: tuple[str, str]) -> bool:
    return isinstance(message, Forward) and (message.entry, message.rid) == key


def _result(runner: ShardRunner, out):
    """What to deliver for a forward result: a token, None, the request's failure, or the encoded
    activations (dtype, shape, a view of the bytes: arrays.encode_array)."""
    if isinstance(out, (int, SampledToken, Checked, Exception)) or out is None:
        return out
    if runner.range.is_last:
        return None  # a prefill chunk on the last stage: nothing to send on
    return encode_array(out)


def _compute(runner: ShardRunner, forward: Forward):
    """Decode the input, run the shard, encode the output; and how long it took (what hop timing
    calls compute). A request's own failure (lost cache, bad array) is returned, not raised."""
    t0 = time.perf_counter()
    try:
        out = runner.forward(forward.rid, forward.array(), forward.pos, forward.sampling, forward.entry,
                             forward.rules, forward.token_ids() if runner.range.is_last else None,
                             forward.prefix_ids(), forward.draft_ids())
    except (CacheMismatch, CacheFull, ProtocolError, PromptCacheMiss) as e:
        out = e
    return _result(runner, out), time.perf_counter() - t0


def _compute_together(runner: ShardRunner, accepted: list[Forward], prompts: bool):
    """_compute for several forwards in one pass: new requests' first prompt chunks (left-padded) or
    decode steps. Each row is charged the whole pass."""
    t0 = time.perf_counter()
    rows, entries, results = [], [], {}
    for i, forward in enumerate(accepted):
        try:
            x = forward.array()
            rows.append((i, PromptStart(forward.rid, x, forward.prefix_ids()) if prompts else DecodeStep(
                forward.rid, x, forward.pos, forward.sampling, forward.token_ids() if runner.range.is_last else None)))
        except ProtocolError as e:
            results[i] = e
            continue
        entries.append(forward.entry)
    run = runner.prefill_batch if prompts else runner.decode_batch
    outs = run([row for _, row in rows], entries) if rows else []
    for (i, _), out in zip(rows, outs):
        results[i] = out
    encoded = [_result(runner, results[i]) for i in range(len(accepted))]
    took = time.perf_counter() - t0
    return [(out, took) for out in encoded]
