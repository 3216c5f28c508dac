"""Who may send this node what: every message, before anything else reads it. MLX thread.

The sender is the node id the connection's hello named (the lane knows it; this node itself for
its own messages). With a swarm secret the hello proves it; without one it is what the peer
claims. Either way these rules hold, since a member with the secret may still be buggy or
compromised, and they are all that stands between the swarm and a stranger without one:

  Forward into layer L of plan P   from the stage before L in P; into P's first stage, from the
                                   entry the frame names, which must be the sender and a node
                                   this node knows. P must be a plan this node was given and
                                   layer L this node's in it.
  Release                          frees only the sender's own request (engine/shard_runner.py
                                   keeps requests per entry), so it needs no rule here.
  Token                            from the last stage of the plan the request runs on, for a
                                   request this node started (entry/own_requests.py).
  Error                            from any stage of that plan, or this node itself.

A token or an error for a request this node did not start, or for a plan it has left, is a
late answer (a step started ahead, a request that gave up): dropped quietly, as before. Only a
frame from someone who may not send it is a refusal, logged at a bounded rate by the caller.

The rule for a forward needs only the plan, never the state of a request, and holds for the
frame's plan even when this node has moved on: a late frame from the right sender still earns
its entry an answer (plan_mismatch), a frame from anyone else earns nobody anything, since the
entry it names may be a victim.
"""

from __future__ import annotations

from typing import Callable

from partitioner import Plan

from ..entry.own_requests import OwnRequests
from ..transport.messages import Error, Forward, Token

LATE = "late"  # an answer for a request or plan this node no longer waits on: dropped, not logged


class SenderRules:
    def __init__(self, node_id: str, known_plan: Callable[[str], Plan | None], is_member: Callable[[str], bool],
                 own: OwnRequests, vocab: int | None = None):
        """`known_plan(plan_id)`: a plan this node was given (stage/stage_host.py); `is_member(node_id)`: in
        this node's view of the swarm; `vocab`: tokens an entry accepts must be below (None: any)."""
        self.node_id, self.known_plan, self.is_member, self.own, self.vocab = node_id, known_plan, is_member, own, vocab

    def mlx_forward(self, sender: str, fwd: Forward) -> str | None:
        """None if `sender` may send `fwd` to this node; else why not."""
        plan = self.known_plan(fwd.plan_id)
        if plan is None:
            return f"plan {fwd.plan_id} is not one this node was given"
        stages = plan.stages
        for i, stage in enumerate(stages):
            if stage.start == fwd.start:
                break
        else:
            return f"no stage of plan {fwd.plan_id} starts at layer {fwd.start}"
        if stage.node_id != self.node_id:
            return f"layer {fwd.start} of plan {fwd.plan_id} is node {stage.node_id}'s"
        if i == 0:
            if sender != fwd.entry:
                return f"the first stage takes a request's tokens from its entry ({fwd.entry}) only"
            if sender != self.node_id and not self.is_member(sender):
                return "the entry is not in this node's view of the swarm"
            return None
        if sender != stages[i - 1].node_id:
            return f"layer {fwd.start} of plan {fwd.plan_id} takes its input from node {stages[i - 1].node_id} only"
        return None

    def mlx_answer(self, sender: str, message: Token | Error) -> str | None:
        """None if `sender` may send this token or error to this node, the entry; LATE or why not."""
        request = self.own.get(message.rid)
        if request is None or request.plan_id != message.plan_id:
            return LATE
        if isinstance(message, Token):
            if sender != request.last:
                return f"tokens of request {message.rid} come from the last stage ({request.last}) only"
        elif sender not in request.stages and sender != self.node_id:
            return f"errors of request {message.rid} come from a stage of plan {message.plan_id} only"
        return None

    def mlx_token_problem(self, token: Token) -> str | None:
        """What is wrong with a token its last stage sent (the stage is buggy, not a stranger)."""
        if self.vocab is not None and not 0 <= token.token < self.vocab:
            return f"the last stage sent token id {token.token}, outside the vocabulary of {self.vocab} tokens"
        return None


def describe(message: Forward | Token | Error) -> str:
    """A refused frame, in a log line: its type and what names its request (never its payload)."""
    kind = type(message).__name__.lower()
    if isinstance(message, Forward):
        return f"a {kind} of request {message.rid} (plan {message.plan_id}, layer {message.start}, " \
               f"positions {message.pos}+{message.length}, entry {message.entry})"
    return f"an {kind} of request {message.rid} (plan {message.plan_id})" if kind == "error" else \
        f"a {kind} of request {message.rid} (plan {message.plan_id})"
