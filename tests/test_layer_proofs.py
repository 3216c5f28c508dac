"""Proof of layers: a peer is planned only once it proved over a real link that it holds the layers it
claims (weights/layer_proof.py, planning/layer_proofs.py, the coordinator's gate).

Real sockets, the real hello and a real model's files; the netns test with real nodes and 200 ghosts
is test_ghost_records_netns.py, fresh nodes that fetch first are test_weights_netns.py."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest
from discovery.profile import NodeProfile
from discovery.view import PeerInfo
from partitioner import ModelSpec

from swarm.models.manifest import build_manifest
from swarm.planning import layer_proofs
from swarm.planning.coordinator import Coordinator
from swarm.planning.layer_proofs import Claim, LayerProofs
from swarm.planning.load_deadlines import LoadDeadlines
from swarm.transport.frames import MAGIC, read_magic
from swarm.transport.handshake import answer, dial_stream
from swarm.transport.link_handshake import LinkAuth
from swarm.transport.stream_link import StreamFrameLink
from swarm.weights.layer_proof import PROVE_MAX_PAYLOAD, PROVE_PURPOSE, ProofFailed, challenge, parse_holds, \
    serve_proofs
from swarm.weights.needs import stage_chunks, stage_tensor_names
from swarm.weights.store import ChunkStore

TIMEOUT = 10.0


class Candidate:
    """A peer port that answers "prove" links with `handler` (the node's own, or a liar's)."""

    def __init__(self, handler):
        self.handler, self.server = handler, None

    async def __aenter__(self):
        async def serve(reader, writer):
            try:
                if await read_magic(reader) == MAGIC:
                    done = await answer(reader, writer, LinkAuth("cand", "default"), {PROVE_PURPOSE},
                                        lambda p, q: None, lambda p, q: None, "test")
                    await self.handler(StreamFrameLink(done.peer, reader, writer, PROVE_MAX_PAYLOAD))
            except Exception:
                pass
            writer.close()
        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def prove(self, store: ChunkStore, chunks, timeout: float = TIMEOUT) -> None:
        link = await dial_stream(("127.0.0.1", self.port), LinkAuth("challenger", "default"), PROVE_PURPOSE,
                                 expected_peer="cand", max_payload=PROVE_MAX_PAYLOAD)
        try:
            await challenge(link, store, chunks, timeout)
        finally:
            await link.close()


@pytest.fixture(scope="module")
def model_files(llama):
    manifest = build_manifest(llama)
    return llama, manifest, stage_chunks(manifest, stage_tensor_names(llama, 2, 4))


def partial_store(tmp_path, model_dir, manifest, chunks) -> ChunkStore:
    store = ChunkStore.partial(tmp_path / "partial", manifest)
    full = ChunkStore.complete(model_dir, manifest)
    for c in chunks:
        store.write(c, full.read(c))
    return store


async def test_a_node_that_holds_the_layers_proves_them_and_one_that_does_not_is_refused(tmp_path, model_files):
    model_dir, manifest, layers = model_files
    mine = ChunkStore.complete(model_dir, manifest)
    async with Candidate(serve_proofs(lambda: ChunkStore.complete(model_dir, manifest))) as holder:
        await holder.prove(mine, layers)
    other_layers = [c for c in manifest.chunks if c.tensor and c not in layers]
    holds_other = partial_store(tmp_path, model_dir, manifest, manifest.support_chunks() + other_layers)
    async with Candidate(serve_proofs(lambda: holds_other)) as other:
        with pytest.raises(ProofFailed, match="not held here"):
            await other.prove(mine, layers)
    async with Candidate(serve_proofs(lambda: None)) as empty:  # knows no model at all
        with pytest.raises(ProofFailed, match="does not hold that model"):
            await empty.prove(mine, layers)


async def test_a_wrong_or_late_answer_fails(model_files):
    model_dir, manifest, layers = model_files
    mine = ChunkStore.complete(model_dir, manifest)

    async def liar(link):  # claims everything, answers a digest of nothing
        await link.receive()
        await link.send({"t": "proof", "digest": "00" * 32})

    async def slow(link):
        await asyncio.sleep(5)
        await serve_proofs(lambda: mine)(link)

    async with Candidate(liar) as c:
        with pytest.raises(ProofFailed, match="wrong digest"):
            await c.prove(mine, layers)
    async with Candidate(slow) as c:
        with pytest.raises(asyncio.TimeoutError):
            await c.prove(mine, layers, timeout=0.5)


async def test_a_challenger_without_those_layers_asks_for_a_small_tensor_whole(tmp_path, model_files):
    model_dir, manifest, layers = model_files
    knows_headers_only = partial_store(tmp_path, model_dir, manifest, manifest.support_chunks())
    async with Candidate(serve_proofs(lambda: ChunkStore.complete(model_dir, manifest))) as holder:
        await holder.prove(knows_headers_only, layers)

    async def forger(link):  # sends bytes of the right length that are not the tensor
        frame = await link.receive()
        n = manifest.chunks[frame.header["whole"][0]].length
        await link.send({"t": "proof", "digest": ""}, os.urandom(n))

    async with Candidate(forger) as c:
        with pytest.raises(ProofFailed, match="does not match the manifest"):
            await c.prove(knows_headers_only, layers)


def test_holds_is_a_layer_range_of_the_model():
    assert parse_holds("0-6", 6) == (0, 6)
    assert parse_holds("2-4", 6) == (2, 4)
    for bad in (None, "", "4-2", "0-7", "-1-3", "a-b", "3", "3-3"):
        assert parse_holds(bad, 6) is None, bad


def recording(asked: list[str], honest: str | None = None):
    """A challenge that notes whom it asked; only node ids starting with `honest` prove."""
    async def challenge_(claim: Claim) -> None:
        asked.append(claim.node_id)
        if honest is None or not claim.node_id.startswith(honest):
            raise ProofFailed("refused")
    return challenge_


async def no_change() -> None:
    pass


async def test_proofs_pass_fail_back_off_and_start_at_a_capped_rate(monkeypatch):
    monkeypatch.setattr(layer_proofs, "FIRST_BACKOFF_S", 60.0)
    asked: list[str] = []
    changed = asyncio.Event()

    async def on_change() -> None:
        changed.set()

    proofs = LayerProofs(recording(asked, "honest"), on_change, rate_per_s=20.0)
    proofs.start()
    try:
        ghosts = [Claim(f"ghost{i}", "i", (0, 6)) for i in range(100)]
        proofs.consider(ghosts)
        await asyncio.sleep(1.0)
        started = len(asked)
        assert 5 <= started <= 20 * 1.0 + 2, started  # at most the rate, whatever the number of claimants
        proofs.consider(ghosts + [Claim("honest", "i", (0, 6))])  # a newcomer is not queued behind them
        await asyncio.wait_for(changed.wait(), TIMEOUT)
        assert proofs.proven("honest", "i") and not proofs.proven("honest", "another instance")
        assert asked.count("honest") == 1
        await asyncio.wait_for(_until(lambda: len(set(asked)) == 101), TIMEOUT)
        assert not any(proofs.proven(g.node_id, "i") for g in ghosts)
        await asyncio.sleep(0.5)
        assert len(asked) == 101, "a failed candidate was asked again before its back-off ended"
    finally:
        await proofs.stop()


async def test_claims_seen_together_are_asked_in_no_order_their_ids_choose():
    """The view lists records by node id; a flood whose ids sort low must not go before the rest."""
    asked: list[str] = []
    proofs = LayerProofs(recording(asked), no_change, rate_per_s=200.0)
    proofs.start()
    try:
        claims = [Claim(f"{i:04d}", "i", (0, 6)) for i in range(30)]
        proofs.consider(claims)
        await asyncio.wait_for(_until(lambda: len(asked) == len(claims)), TIMEOUT)
        assert sorted(asked) == [c.node_id for c in claims] and asked != sorted(asked), asked
    finally:
        await proofs.stop()


async def test_a_finished_challenge_frees_its_place_for_the_next_at_once():
    """With every place in flight taken, the end of one challenge starts the next: nothing else need
    wake the loop (its place was freed only after the loop had looked, and the queue stalled until
    the view changed)."""
    asked: list[str] = []
    proofs = LayerProofs(recording(asked), no_change, rate_per_s=200.0, max_in_flight=1)
    proofs.start()
    try:
        proofs.consider([Claim(f"c{i}", "i", (0, 6)) for i in range(5)])
        await asyncio.wait_for(_until(lambda: len(asked) == 5), TIMEOUT)
    finally:
        await proofs.stop()


async def test_peers_that_served_us_checked_weights_are_asked_before_a_flood_seen_with_them():
    """A node that fetched its layers meets its swarm together with 200 records claiming the model: the
    peers whose chunks passed its checks are asked first, so it plans with them at once and is not left
    out by them while it works through the flood."""
    asked: list[str] = []
    proofs = LayerProofs(recording(asked, "honest"), no_change, rate_per_s=200.0, max_in_flight=1)
    proofs.start()
    try:
        claims = [Claim("honest-0", "i", (0, 6)), Claim("honest-1", "i", (0, 6))]
        claims += [Claim(f"ghost-{i:03d}", "i", (0, 6)) for i in range(200)]
        proofs.prefer(["honest-0", "honest-1"])
        proofs.consider(claims)
        await asyncio.wait_for(_until(lambda: len(asked) >= 4), TIMEOUT)
        assert set(asked[:2]) == {"honest-0", "honest-1"}, asked[:4]
        assert proofs.proven("honest-0", "i") and proofs.proven("honest-1", "i")
    finally:
        await proofs.stop()


async def test_a_new_claim_is_proved_while_the_proof_before_keeps_the_node_planned():
    results: dict[tuple[int, int], bool] = {(0, 3): True, (0, 6): False}
    asked: list[tuple[int, int]] = []

    async def challenge_(claim: Claim) -> None:
        asked.append(claim.holds)
        if not results[claim.holds]:
            raise ProofFailed("refused")

    async def on_change() -> None:
        pass

    proofs = LayerProofs(challenge_, on_change)
    proofs.start()
    try:
        proofs.consider([Claim("b", "i", (0, 3))])
        await asyncio.wait_for(_until(lambda: proofs.proven("b", "i")), TIMEOUT)
        proofs.consider([Claim("b", "i", (0, 6))])  # it says it holds more now: asked at once
        await asyncio.wait_for(_until(lambda: asked == [(0, 3), (0, 6)]), TIMEOUT)
        await asyncio.sleep(0.1)
        assert proofs.proven("b", "i"), "a claim that fails does not undo the proof of the one before"
    finally:
        await proofs.stop()


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.02)


class FixedView:
    def __init__(self, own: str, extras: dict[str, dict]):
        self.own, self.extras = own, extras

    def view(self, include_self: bool = False) -> list[PeerInfo]:
        return [PeerInfo(NodeProfile(n, n, "default", 8800, 8801, memory_available=8 << 30, speed=0.002,
                                     model_fingerprint="fp", instance="i", extra=self.extras[n]), ("10.0.0.1",),
                         "mdns") for n in sorted(self.extras) if include_self or n != self.own]

    @property
    def profile(self) -> NodeProfile:
        return self.view(include_self=True)[[n for n in sorted(self.extras)].index(self.own)].profile


async def test_the_coordinator_plans_itself_and_only_peers_that_proved_their_layers():
    view = FixedView("a", {"a": {"holds": "0-30"}, "b": {"holds": "0-30"}, "ghost": {"holds": "0-30"},
                           "new": {}})

    async def challenge_(claim: Claim) -> None:
        if claim.node_id != "b":
            raise ProofFailed("refused")

    async def on_change() -> None:
        pass

    proofs = LayerProofs(challenge_, on_change)
    coord = Coordinator("a", ModelSpec(30, 10 << 20), "fp", view, None, None, deadlines=LoadDeadlines("a"),
                        proofs=proofs)
    assert [m.node_id for m in coord.members()] == ["a"]
    proofs.start()
    try:
        coord.gate.ask_for_proofs()  # what replan() does first
        await asyncio.wait_for(_until(lambda: proofs.proven("b", "i")), TIMEOUT)
        await asyncio.wait_for(_until(lambda: proofs.failed >= 1), TIMEOUT)
        assert [m.node_id for m in coord.members()] == ["a", "b"]
        assert proofs.started == 2, "a peer that claims no layers is not challenged (nor planned)"
        # A node that fetches its model and was in no plan that served yet plans the other newcomers too
        # (each fetches its share of one plan), and the peers that proved their layers; never a claim that
        # failed.
        coord.gate.weights = SimpleNamespace(store=SimpleNamespace(writable=True))
        assert [m.node_id for m in coord.members()] == ["a", "b", "new"]
    finally:
        await proofs.stop()
