"""The node's parts, built in dependency order: each from the parts before it, none started.

Two groups, because a node that fetches its model from its peers must be on the network before
it knows its model: `PeerSide` (who else is there, the peer port, weights shared with peers),
then, once the model is known, `Serving` (the stage, planning, the entry, the node's inbox, the
HTTP API). node.py starts them in this order and stops them in reverse.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from discovery import Discovery
from discovery.profile import NodeProfile
from discovery.profile_keys import FETCH_KEY
from discovery.view import PeerEvent
from partitioner import ModelSpec

from ..api.admission import Admission
from ..api.app import make_app
from ..api.auth import ApiAccess
from ..api.connection_cap import CappedAppRunner
from ..api.request_gate import RequestGate
from ..api.web_guard import WebGuard
from ..backend import Backend
from ..engine.constraints import GrammarVocab
from ..engine.model_bytes import ModelBytes
from ..engine.model_outline import Outline
from ..engine.prompt_cache import PromptCacheSize
from ..engine.speed_probe import SpeedProbe
from ..engine.worker import MlxWorker
from ..entry.entry_inbox import EntryInbox
from ..entry.hop_timing import HopTiming
from ..entry.own_requests import OwnRequests
from ..entry.pending_tokens import PendingTokens
from ..entry.prompt_index import PromptIndex
from ..entry.run_ahead import RunAhead
from ..entry.service import InferenceService
from ..entry.draft_model import DraftModel
from ..entry.stats import RequestStats
from ..entry.swarm_pipeline import SwarmPipelines
from ..events import EventBus
from ..models.generation_defaults import GenerationDefaults
from ..models.resolve import LocalModel
from ..planning.coordinator import Coordinator
from ..planning.layer_proofs import Claim, LayerProofs
from ..stage.stage_host import StageHost
from ..stage.stage_service import StageService
from ..status.node_status import NodeStatus
from ..status.peer_stats import PeerStats
from ..transport.frame_hold import FrameHold
from ..transport.handshake import dial_stream
from ..transport.lane import DataLane
from ..transport.link_handshake import LinkAuth
from ..transport.links import PeerLinks
from ..transport.listener import PeerListener
from ..transport.peer_profiles import ProfileFetcher
from ..weights.layer_proof import PROVE_MAX_PAYLOAD, PROVE_PURPOSE, challenge, serve_proofs
from ..weights.peer_weights import PeerWeights
from ..weights.store import ChunkStore
from ..weights.transfer import WEIGHTS_MAX_PAYLOAD, WEIGHTS_PURPOSE
from . import peer_security
from .config import AUTO_PROMPT_CACHE, NodeConfig
from .inbox import NodeInbox
from .lane_probe import LaneProbe
from .link_meter import LinkMeter
from .path_choice import PATH_PURPOSE, PathChoice, serve_paths
from .mlx_rounds import ROUND_MAX_PAYLOAD, ROUND_PURPOSE, ask_round, serve_round
from .present_speed import PresentSpeed
from .secrets import API_KEY_FROM_SECRET, Secret
from .sender_rules import SenderRules
from .speed_follower import SpeedFollower


@dataclass
class PeerSide:
    profile: NodeProfile
    discovery: Discovery
    peer_events: asyncio.Queue[PeerEvent]  # wait here until planning consumes them
    links: PeerLinks
    lane: DataLane
    listener: PeerListener
    weights: PeerWeights
    prove: Callable  # (Claim) -> awaitable: the peer proves it holds those layers, or it raises
    paths: PathChoice  # which of a peer's addresses its data link takes
    ask_round: Callable  # (peer, timeout) -> awaitable: its MLX thread's longest recent round, or None


# A candidate answers a challenge within this (a few KiB read from its disk; generous for a loaded machine).
PROVE_TIMEOUT_S = 5.0


def build_peer_side(cfg: NodeConfig, profile: NodeProfile, worker: MlxWorker, link_key: bytes | None,
                    on_duplicate: Callable, store: ChunkStore | None) -> PeerSide:
    """Who else is there, and the peer port. Profiles and probes go over the peer protocol: with a
    secret, only peers that prove it enter the view, and an mDNS record only names an endpoint to ask."""
    node_id = profile.node_id
    auth = LinkAuth(node_id, cfg.swarm, link_key)
    peer_events: asyncio.Queue[PeerEvent] = asyncio.Queue()
    discovery = Discovery(profile, interfaces=cfg.interfaces, static_peers=cfg.peers, mdns=cfg.mdns,
                          on_event=peer_events, state_dir=cfg.state_dir, on_duplicate=on_duplicate,
                          fetch_profile=ProfileFetcher(auth), mdns_is_hint=link_key is not None)

    # The peer data path: one connection per peer, read and written on the MLX thread; every message
    # goes to the node's inbox (Serving), and so does a link that breaks. A peer with several addresses
    # is reached at the fastest that answers (path_choice.py).
    links = PeerLinks(node_id)
    hold = FrameHold.from_environment()

    def tell_lane(peer: str, address: str, problem: str | None) -> None:
        if problem is None:
            worker.post(lane.mlx_path_faster, peer, address)
        else:
            worker.post(lane.mlx_path_failed, peer, address, problem)

    paths = PathChoice(discovery.view, auth, links, tell_lane, hold)
    lane = DataLane(node_id, cfg.swarm, links, worker.watch, worker.post, discovery.endpoint_of, key=link_key,
                    auth=auth, writes=worker, hold=hold,
                    endpoints_of=lambda peer: paths.endpoints_of(peer, discovery.endpoint_of(peer)))
    listener = PeerListener(node_id, cfg.swarm, cfg.peer_host, cfg.peer_port, links, lane,
                            lambda: discovery.profile, key=link_key, auth=auth, is_member=discovery.is_peer_address,
                            on_proved=discovery.heard_from)

    # Weights: served to peers from what this node holds; fetched from them for layers it lacks, over
    # links for that purpose (authenticated and sealed like the data path's when the swarm has a secret).
    def open_weights_link(peer: str):
        return dial_stream(discovery.endpoint_of(peer), auth, WEIGHTS_PURPOSE, expected_peer=peer,
                           max_payload=WEIGHTS_MAX_PAYLOAD)

    def holders_of(fingerprint: str) -> list[str]:
        return [p.node_id for p in discovery.view() if p.profile.model_fingerprint == fingerprint]

    weights = PeerWeights(worker, open_weights_link, holders_of,
                          lambda st: discovery.update_profile(extra={FETCH_KEY: st.profile_field()}), store=store)
    listener.serve_purpose(WEIGHTS_PURPOSE, weights.serve)

    # Proofs of layers: answered from what this node holds; asked of a peer before it is planned.
    listener.serve_purpose(PROVE_PURPOSE, serve_proofs(lambda: weights.store))

    async def prove(claim: Claim) -> None:
        endpoint = discovery.endpoint_of(claim.node_id)
        if endpoint is None or weights.store is None:
            raise LookupError("not in the view, or no model here to check with")
        chunks = await weights.stage_chunks(*claim.holds)
        link = await dial_stream(endpoint, auth, PROVE_PURPOSE, expected_peer=claim.node_id,
                                 max_payload=PROVE_MAX_PAYLOAD, timeout=PROVE_TIMEOUT_S)
        try:
            await challenge(link, weights.store, chunks, PROVE_TIMEOUT_S)
        finally:
            await link.close()

    # Path probes: answered on the event loop, held like the lane's frames to their address.
    listener.serve_purpose(PATH_PURPOSE, serve_paths(hold))

    # How busy a peer's MLX thread has been: asked of one that does not answer a probe.
    listener.serve_purpose(ROUND_PURPOSE, serve_round(worker))

    async def ask_peer_round(peer: str, timeout: float) -> float | None:
        endpoint = discovery.endpoint_of(peer)
        if endpoint is None:
            return None
        return await ask_round(lambda: dial_stream(endpoint, auth, ROUND_PURPOSE, expected_peer=peer,
                                                   max_payload=ROUND_MAX_PAYLOAD, timeout=timeout), timeout)

    return PeerSide(profile, discovery, peer_events, links, lane, listener, weights, prove, paths,
                    ask_peer_round)


@dataclass
class Serving:
    inbox: NodeInbox
    coordinator: Coordinator
    peer_stats: PeerStats
    runner: CappedAppRunner
    link_meter: LinkMeter
    speed: SpeedFollower | None  # None: the speed was stated (--speed), and stays


def api_access(key: Secret) -> ApiAccess:
    """Who may use the API: a key derived from the swarm secret spares clients on this machine."""
    return ApiAccess(key.value, local_without_key=key.source == API_KEY_FROM_SECRET)


def build_serving(cfg: NodeConfig, peers: PeerSide, worker: MlxWorker, model: LocalModel, tokenizer,
                  sizes: ModelBytes, spec: ModelSpec, vocab: int | None, dtype, dequantize: bool, outlined: Outline,
                  backend: Backend,
                  defaults: GenerationDefaults, gate: RequestGate, api_key: Secret, secret: Secret | None,
                  loop: asyncio.AbstractEventLoop, guard: WebGuard, speculate: str = "off",
                  draft_model: DraftModel | None = None) -> Serving:
    """`speculate`: what the entry's requests draft with (entry/speculation.py's speculation_mode), with
    `draft_model` where it says so."""
    node_id, discovery, lane = peers.profile.node_id, peers.discovery, peers.lane

    # The stage: the layers this node holds, and the frames for them queued, batched and computed.
    grammar_vocab = GrammarVocab(tokenizer)  # grammars: checked by the entry, applied by the last stage
    prompt_cache = PromptCacheSize(cfg.prompt_cache, peers.profile.memory_available, AUTO_PROMPT_CACHE,
                                   cfg.kv_reserve_tokens)
    host = StageHost(model.path, dtype, worker, dequantize=dequantize, context=model.context_length,
                     layer_caches=sizes.caches, vocab=grammar_vocab, outlined=outlined, prompt_cache=prompt_cache)
    stage_service = StageService(host, lane, worker, max_batch=cfg.batch_decode,
                                 prompt_gather_s=cfg.prompt_gather_ms / 1000)

    # Planning: the plan from the view, our layers loaded, agreement.
    events = EventBus()
    # does a peer read its data lane? (planning leaves out one that does not)
    probes = LaneProbe(lane, worker, loop, peers.ask_round)

    async def proofs_changed() -> None:
        await coordinator.replan()

    proofs = LayerProofs(peers.prove, proofs_changed)
    peers.weights.served_us = proofs.prefer  # peers whose chunks passed our checks are asked first
    coordinator = Coordinator(node_id, spec, model.fingerprint, discovery, host, events, strategy=cfg.strategy,
                              recovery_timeout=cfg.recovery_timeout, weights=peers.weights, proofs=proofs,
                              probe=probes.probe)

    # The entry: its requests' pending tokens (broken when planning says a plan lost a stage), the
    # run-ahead, and its inbox for the tokens and errors that come back.
    pending, run_ahead, hop_timing, own = PendingTokens(), RunAhead(node_id), HopTiming(), OwnRequests()
    coordinator.on_plans_broken.append(pending.break_all)
    entry_inbox = EntryInbox(node_id, worker, pending, run_ahead, loop, stage_service.mlx_send_or_fail,
                             lane.mlx_send, lane.mlx_sending_together,
                             stage_lost=coordinator.break_plans_through)

    # The node's inbox: every peer message, checked first against who may send it (sender_rules.py),
    # to the stage or to the entry.
    sender_rules = SenderRules(node_id, host.known_plan, lambda peer: discovery.endpoint_of(peer) is not None, own,
                               vocab)
    # What this node measures of its links and of itself, advertised in its profile: our own profile's
    # change is no peer event, so we re-plan here (peers re-plan on its update).
    async def publish_links(measured: dict) -> None:
        await discovery.update_profile(links=measured)
        await coordinator.replan()

    def measured_peers() -> list[str]:
        """Peers that could be planned: a record that only claims our model (never proved its layers) is
        not measured, or a crowd of such records would have every node dial each of them."""
        return [p.node_id for p in discovery.view() if p.profile.model_fingerprint == model.fingerprint
                and coordinator.gate.plannable(p.profile, coordinator.plan, coordinator.before)]

    link_meter = LinkMeter(node_id, lane, worker, loop, measured_peers, publish_links)
    speed = None
    if not cfg.speed:
        async def publish_speed(value: float) -> None:
            await discovery.update_profile(speed=value)
            await coordinator.replan()

        head_layers = sizes.head / max(1, sum(sizes.per_layer) / max(1, len(sizes.per_layer)))
        speed = SpeedFollower(PresentSpeed(discovery.profile.speed), worker, head_layers, publish_speed,
                              lambda: SpeedProbe(model.path, model.n_layers, dtype, dequantize, outlined),
                              moves_layers=coordinator.moves_layers)
        stage_service.on_pass = speed.mlx_pass

    inbox = NodeInbox(lane, worker, sender_rules, stage_service, entry_inbox, probes,
                      lambda peer, problem: loop.call_soon_threadsafe(coordinator.peer_stalled, peer, problem),
                      link_meter)

    # Requests through pipelines on agreed plans.
    stats = RequestStats(events.emit, entry=node_id)
    pipelines = SwarmPipelines(coordinator.agreed_plan, node_id, entry_inbox, pending, cfg.token_timeout,
                               hop_timing, run_ahead, own, PromptIndex() if cfg.prompt_cache != 0 else None,
                               watch=coordinator)
    service = InferenceService(tokenizer, model.context_length, pipelines, stats, cfg.default_max_tokens,
                               cfg.recovery_timeout, grammar_vocab, cfg.prefill_chunk,
                               speculate=speculate, draft_model=draft_model)

    # What the node tells: /health, /v1/topology, and the HTTP API over it all.
    peer_stats = PeerStats(discovery)
    status = NodeStatus(model, backend, discovery, coordinator, host, stage_service, peers.links, stats,
                        hop_timing, peer_stats, peers.weights, api_key=bool(api_key),
                        peers=peer_security.describe(secret), prompt_chunk=service.prefill_step,
                        speculation=service.speculation_status, paths=peers.paths)
    admission = Admission(cfg.max_active, cfg.max_queue)
    app = make_app(service, status, events, model.model_id, admission, defaults, gate, api_key=api_access(api_key),
                   body_timeout=cfg.http_timeout, guard=guard)
    # keepalive_timeout closes a connection idle between requests, and one that never completes
    # its headers (aiohttp's default keeps both for an hour). handler_cancellation: a client that
    # goes away cancels its handler, streaming or not, and leaving the handler frees the request on
    # every stage. Taken requests are drained before a stop (lifecycle.py), so a stop waits
    # for nothing long; a restart under a new id cuts off what it finds within shutdown_timeout.
    runner = CappedAppRunner(app, per_address=cfg.http_connections_per_address, access_log=None,
                             keepalive_timeout=cfg.http_timeout, handler_cancellation=True, shutdown_timeout=1.0)
    return Serving(inbox, coordinator, peer_stats, runner, link_meter, speed)
