"""Weights between holders and a fetching node over real loopback sockets."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time

import mlx.core as mx
import pytest

from swarm.transport.frames import PREFIX, pack_header
from swarm.transport.stream_link import StreamFrameLink
from swarm.transport.thread_link import ThreadFrameLink, run_on_own_thread
from swarm.models import manifest as manifest_module
from swarm.models.manifest import build_manifest
from swarm.weights.store import ChunkStore
from swarm.weights.transfer import FetchStuck, WeightFetch, fetch_manifest, serve_weights_on_thread

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(manifest_module, "CHUNK_BYTES", 64 * 1024)
    d = tmp_path / "model"
    d.mkdir()
    weights = {f"model.layers.{i}.w": mx.random.normal((256, 256), key=mx.random.key(i)) for i in range(8)}
    mx.save_safetensors(str(d / "model.safetensors"), weights)
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
    return d


class Holder:
    """A peer port that serves a store's chunks; `kill()` drops it mid-transfer."""

    def __init__(self, name: str, store: ChunkStore, slow: float = 0.0, send_chunk=None):
        """`send_chunk(link, send_file, header, file, offset, length, buffer)`: how it sends a chunk (a liar's)."""
        self.name, self.store, self.slow, self.send_chunk = name, store, slow, send_chunk
        self.links: list[ThreadFrameLink] = []
        self.serving: set[asyncio.Task] = set()

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader, writer):
        self.serving.add(asyncio.current_task())
        link = StreamFrameLink("fetcher", reader, writer)
        bulk = await link.detach(30.0)  # as serve_weights does, keeping the link to kill it
        self.links.append(bulk)
        if self.slow:
            send_file = bulk.send_file

            def slow_send_file(*args):
                time.sleep(self.slow)
                send_file(*args)
            bulk.send_file = slow_send_file
        if self.send_chunk:
            send_file = bulk.send_file
            bulk.send_file = lambda *args: self.send_chunk(bulk, send_file, *args)
        try:
            await run_on_own_thread(bulk, serve_weights_on_thread, bulk, self.store)
        except Exception:
            pass
        finally:
            bulk.close()
            await link.close()

    async def kill(self):
        self.server.close()
        for link in self.links:
            link.abort()
        await asyncio.gather(*self.serving, return_exceptions=True)  # its threads are done


def opener(holders: dict[str, Holder]):
    async def open_link(name: str):
        reader, writer = await asyncio.open_connection("127.0.0.1", holders[name].port)
        return StreamFrameLink(name, reader, writer)
    return open_link


async def test_fetch_everything_from_two_holders_and_the_manifest_checks_out(model_dir, tmp_path):
    m = build_manifest(model_dir)
    holders = {n: await Holder(n, ChunkStore.complete(model_dir, m)).start() for n in ("a", "b")}
    link = await opener(holders)("a")
    assert await fetch_manifest(link, m.fingerprint) == m
    await link.close()
    store = ChunkStore.partial(tmp_path / "copy", m)
    fetch = WeightFetch(store, list(m.chunks), opener(holders), lambda: list(holders))
    report = await fetch.run()
    assert store.missing(list(m.chunks)) == []
    assert (tmp_path / "copy" / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert set(report.per_holder) == {"a", "b"}, "both holders served"
    assert report.progress.received_bytes == m.total_bytes


async def test_one_holder_is_fetched_from_over_several_links_a_piece_at_a_time(model_dir, tmp_path, monkeypatch):
    from swarm.weights import transfer

    monkeypatch.setattr(transfer, "PIECE_BYTES", 4096)  # many pieces per chunk: each hashed and written in turn
    m = build_manifest(model_dir)
    sent_on: dict[int, int] = {}  # holder's link -> chunks it sent

    def counting(link, send_file, header, *args):
        sent_on[id(link)] = sent_on.get(id(link), 0) + 1
        return send_file(header, *args)
    holders = {"a": await Holder("a", ChunkStore.complete(model_dir, m), send_chunk=counting).start()}
    store = ChunkStore.partial(tmp_path / "copy", m)
    report = await WeightFetch(store, list(m.chunks), opener(holders), lambda: list(holders)).run()
    assert store.missing(list(m.chunks)) == [] and report.per_holder == {"a": m.total_bytes}
    assert (tmp_path / "copy" / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert len(sent_on) == transfer.LINKS_PER_HOLDER == 2 and min(sent_on.values()) > 0, sent_on


async def test_a_holder_that_dies_mid_transfer_is_replaced(model_dir, tmp_path):
    m = build_manifest(model_dir)
    holders = {"slow": await Holder("slow", ChunkStore.complete(model_dir, m), slow=0.05).start(),
               "fast": await Holder("fast", ChunkStore.complete(model_dir, m)).start()}
    store = ChunkStore.partial(tmp_path / "copy", m)
    around = ["slow"]
    fetch = WeightFetch(store, list(m.chunks), opener(holders), lambda: list(around))
    task = asyncio.create_task(fetch.run())
    while fetch.per_holder.get("slow", 0) == 0:
        await asyncio.sleep(0.01)
    around.append("fast")
    await holders["slow"].kill()
    report = await asyncio.wait_for(task, 30)
    assert store.missing(list(m.chunks)) == []
    assert report.per_holder["slow"] < m.total_bytes / 2


async def test_tampered_bytes_are_refused_and_fetched_elsewhere(model_dir, tmp_path):
    m = build_manifest(model_dir)
    tampered = tmp_path / "tampered"
    shutil.copytree(model_dir, tampered)
    data = bytearray((tampered / "model.safetensors").read_bytes())
    victim = m.tensor_chunks(["model.layers.3.w"])[1]
    data[victim.offset + 10] ^= 0xFF  # altered after its manifest was made
    (tampered / "model.safetensors").write_bytes(bytes(data))
    liar = await Holder("liar", ChunkStore.complete(tampered, m)).start()
    honest = await Holder("honest", ChunkStore.complete(model_dir, m)).start()
    holders = {"liar": liar}
    store = ChunkStore.partial(tmp_path / "copy", m)
    fetch = WeightFetch(store, list(m.chunks), opener(holders), lambda: list(holders), stuck_after_s=0.5)
    with pytest.raises(FetchStuck):
        await fetch.run()
    assert not store.has(victim) and len(store.missing(list(m.chunks))) == 1
    holders["honest"] = honest
    fetch = WeightFetch(store, list(m.chunks), opener(holders), lambda: list(holders))
    report = await fetch.run()
    assert store.missing(list(m.chunks)) == [] and report.per_holder == {"honest": victim.length}
    assert (tmp_path / "copy" / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()


async def test_a_manifest_that_does_not_match_the_fingerprint_is_a_state_then_an_honest_holder_is_used(
        model_dir, tmp_path, caplog):
    from types import SimpleNamespace

    from swarm.weights.model_from_peers import model_files_from_peers
    from swarm.weights.peer_weights import PeerWeights

    honest = build_manifest(model_dir)
    (model_dir / "config.json").write_text(json.dumps({"num_hidden_layers": 8, "changed": True}))
    liar = await Holder("liar", ChunkStore.complete(model_dir, build_manifest(model_dir))).start()
    holders = {"liar": liar}
    # Both advertise the honest fingerprint; the liar's manifest hashes to another.
    peers = [SimpleNamespace(node_id="liar", profile=SimpleNamespace(model_id="m", model_fingerprint=honest.fingerprint))]
    discovery = SimpleNamespace(view=lambda: list(peers))
    weights = PeerWeights(None, opener(holders), lambda fingerprint: list(holders))
    reports = []

    async def report(line, state):
        reports.append(state)

    task = asyncio.create_task(model_files_from_peers("m", discovery, opener(holders), tmp_path / "models",
                                                      weights, report))
    for _ in range(100):
        if weights.status.state == "mismatch":
            break
        await asyncio.sleep(0.05)
    assert weights.status.state == "mismatch" and reports == ["mismatch"], (weights.status, reports)
    assert "matches its fingerprint" in weights.status.error and not task.done()

    good_dir = tmp_path / "good"
    shutil.copytree(model_dir, good_dir)
    (good_dir / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
    holders["honest"] = await Holder("honest", ChunkStore.complete(good_dir, honest)).start()
    peers.append(SimpleNamespace(node_id="honest", profile=SimpleNamespace(model_id="m",
                                                                          model_fingerprint=honest.fingerprint)))
    model_id, manifest = await asyncio.wait_for(task, 20)
    assert (model_id, manifest.fingerprint) == ("m", honest.fingerprint)
    assert sum("matches its fingerprint" in r.getMessage() for r in caplog.records) == 1   # said once, not per try
    await liar.kill()
    await holders["honest"].kill()


def lying_about(victim, how: str):
    """A holder's send_chunk that does `how` with chunk `victim` and sends every other chunk honestly."""
    def send_chunk(link, send_file, header, file, offset, length, buffer):
        if header["i"] != victim.index:
            return send_file(header, file, offset, length, buffer)
        if how in ("short", "long"):  # a well-formed frame of the wrong length: real bytes, one too few or many
            return send_file(header, file, offset, length + (1 if how == "long" else -1), buffer)
        # Half a chunk of a frame announcing all of it, then the link is cut or goes silent.
        packed = pack_header(header)
        link.sock.sendall(PREFIX.pack(len(packed), length) + packed + os.pread(file.fileno(), length // 2, offset))
        if how == "close":
            link.abort()
            raise ConnectionError("closed mid-chunk")
        time.sleep(1.5)  # stalls well past the fetcher's stall_after_s
        raise ConnectionError("stalled mid-chunk")
    return send_chunk


@pytest.mark.parametrize("how", ["short", "long", "close", "stall"])
async def test_a_holder_that_sends_a_wrong_length_or_breaks_off_mid_chunk_is_replaced(model_dir, tmp_path, how,
                                                                                      caplog):
    m = build_manifest(model_dir)
    victim = m.tensor_chunks(["model.layers.5.w"])[0]
    liar = Holder("liar", ChunkStore.complete(model_dir, m), send_chunk=lying_about(victim, how))
    holders = {"liar": await liar.start(), "honest": await Holder("honest", ChunkStore.complete(model_dir, m)).start()}
    store = ChunkStore.partial(tmp_path / "copy", m)
    around = ["liar"]  # alone until it broke off (so it is the one asked for the victim)
    fetch = WeightFetch(store, list(m.chunks), opener(holders), lambda: list(around), stall_after_s=0.5)
    task = asyncio.create_task(fetch.run())
    while not any("from liar failed" in r.getMessage() for r in caplog.records):
        assert not task.done()
        await asyncio.sleep(0.02)
    around.append("honest")
    report = await asyncio.wait_for(task, 30)
    assert store.missing(list(m.chunks)) == []
    assert (tmp_path / "copy" / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert report.per_holder.get("liar", 0) > 0, "the liar served the chunks it did not lie about"
    if how in ("short", "long"):  # refused, and never asked of the liar again
        assert report.progress.rejected == 1
    for holder in holders.values():
        await holder.kill()


async def test_a_holder_that_goes_silent_mid_chunk_is_dropped_and_a_cancelled_fetch_ends(model_dir, tmp_path, caplog):
    m = build_manifest(model_dir)
    victim = m.tensor_chunks(["model.layers.2.w"])[0]
    holders = {"liar": await Holder("liar", ChunkStore.complete(model_dir, m),
                                    send_chunk=lying_about(victim, "stall")).start()}
    store = ChunkStore.partial(tmp_path / "copy", m)
    fetch = WeightFetch(store, list(m.chunks), opener(holders), lambda: list(holders), stall_after_s=0.3)
    task = asyncio.create_task(fetch.run())
    while sum("from liar failed: nothing from liar" in r.getMessage() for r in caplog.records) < 2:
        assert not task.done()  # the stall is noticed, the link dropped, the holder asked again: no hang
        await asyncio.sleep(0.05)
    assert not store.has(victim)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)  # cancelling it ends its threads too
    await holders["liar"].kill()
