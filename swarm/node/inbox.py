"""The node's inbox: every message for this node, checked against its sender and routed. MLX thread.

The data lane (transport/lane.py) decodes each frame from a peer into a typed message and
calls `mlx_on_message(sender, message)`, as it does for the messages this node sends itself
(the entry's own steps into its own stage 0, the last stage's tokens for its own requests):

  Forward, Release -> the stage (stage/stage_service.py): queued, batched, computed, sent on
  Token, Error     -> the entry (entry/entry_inbox.py): a request this node is the entry of
  Probe            -> answered with Probed at once, to anyone (it asks only: do you read?)
  Probed           -> the probe that waits for it (lane_probe.py)
  Ping             -> answered with Pong at once, to anyone (link_meter.py)
  Pong             -> the link meter (link_meter.py), which times it

Who may send what is decided first, for every message (sender_rules.py): a frame from anyone
else is dropped with one log line at a bounded rate (transport/log_limit.py), and nobody else
hears of it, since the entry it names may be a victim.

A link that breaks may have lost frames: the stage tells the entries of the requests it sent on
it, and the entry replays its own (`mlx_link_broken`).
"""

from __future__ import annotations

import logging
from typing import Callable

from ..engine.worker import MlxWorker
from ..entry.entry_inbox import EntryInbox
from ..stage.stage_service import LOG_EVERY_S, StageService
from ..transport.lane import DataLane
from ..transport.log_limit import LogLimiter
from ..transport.errors import PeerUnreachable
from ..transport.messages import Error, Forward, Message, Release, Token
from ..transport.ping_messages import Ping, Pong
from ..transport.probe_messages import Probe, Probed
from .lane_probe import LaneProbe
from .link_meter import LinkMeter, answer_ping
from .sender_rules import LATE, SenderRules, describe

log = logging.getLogger(__name__)


class NodeInbox:
    def __init__(self, lane: DataLane, worker: MlxWorker, sender_rules: SenderRules, stage: StageService,
                 entry: EntryInbox, probes: LaneProbe | None = None,
                 on_stalled: Callable[[str, str], None] | None = None, links: LinkMeter | None = None):
        """`on_stalled(peer, problem)`: a link took no data (MLX thread): planning leaves that peer out."""
        self.lane, self.worker, self.sender_rules, self.stage, self.entry = lane, worker, sender_rules, stage, entry
        self.probes, self.on_stalled, self.links = probes, on_stalled, links
        self.refusals = stage.refusals  # one count per node: the stage refuses releases of others' requests
        self.failures = LogLimiter(log, logging.INFO)  # tokens a last stage got wrong (outside the vocabulary)

    def start(self) -> None:
        """Take every message for this node from now on (the lane's handlers, the stage's queue)."""
        self.lane.serve(self.mlx_on_message, self.mlx_link_broken, self.on_stalled)
        self.stage.start()

    async def stop(self) -> None:
        await self.worker.run(self.lane.mlx_close)

    def drop_peer(self, node_id: str) -> None:
        """A peer left (event loop): close our connection to it."""
        self.worker.post(self.lane.mlx_drop, node_id)

    # -- MLX thread -------------------------------------------------------------------------
    def mlx_on_message(self, sender: str, message: Message) -> None:
        if isinstance(message, Forward):
            why = self.sender_rules.mlx_forward(sender, message)
            if why is None:
                self.stage.mlx_take(sender, message)
            else:
                self._mlx_refuse(sender, describe(message), why)
        elif isinstance(message, Release):
            self.stage.mlx_take(sender, message)  # it frees the sender's own request only
        elif isinstance(message, (Token, Error)):
            why = self.sender_rules.mlx_answer(sender, message)
            if why is None:
                self.entry.mlx_answer(self._mlx_checked(message))
                return
            if why is not LATE:
                self._mlx_refuse(sender, describe(message), why)
            self.entry.mlx_late()
        elif isinstance(message, Probe):
            try:
                self.lane.mlx_send(sender, Probed(message.nonce))
            except PeerUnreachable:
                pass  # it asked and went: nobody waits for the answer
        elif isinstance(message, Probed):
            if self.probes is not None:
                self.probes.mlx_answered(sender, message.nonce)
        elif isinstance(message, Ping):
            answer_ping(self.lane, self.worker, sender, message)
        elif isinstance(message, Pong):
            if self.links is not None:
                self.links.mlx_pong(sender, message)
        else:  # the lane passes nothing else: a bug if it did
            log.error("no handler for a %s from %s", type(message).__name__, sender)

    def _mlx_refuse(self, sender: str, what: str, why: str) -> None:
        self.refusals.every(sender, LOG_EVERY_S, "refused %s from %s: %s", what, sender, why)

    def _mlx_checked(self, message: Token | Error) -> Token | Error:
        """A token its last stage may send but that is wrong (a buggy stage) is an Error: the request replays."""
        if isinstance(message, Token) and (problem := self.sender_rules.mlx_token_problem(message)):
            self.failures.every("token", LOG_EVERY_S, "request %s: %s", message.rid, problem)
            return Error(message.rid, message.plan_id, "protocol", problem, message.attempt)
        return message

    def mlx_link_broken(self, peer: str, problem: str) -> None:
        """The lane's report: the link to `peer` broke."""
        self.stage.mlx_link_broken(peer, problem)
        self.entry.mlx_link_broken(peer, problem)
        if self.probes is not None:
            self.probes.mlx_link_broken(peer)
