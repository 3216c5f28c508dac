"""Manifests, partial stores and the fetch queue, on real safetensors files."""

from __future__ import annotations

import hashlib
import json

import blake3
import mlx.core as mx
import pytest

from swarm.models import manifest as manifest_module
from swarm.weights.fetch_queue import FetchQueue
from swarm.models.manifest import Manifest, ManifestError, build_manifest, cached_manifest
from swarm.models.safetensors_header import read_layout
from swarm.weights.store import HELD_FILE, ChunkRejected, ChunkStore


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(manifest_module, "CHUNK_BYTES", 4096)  # several chunks per large tensor
    d = tmp_path / "model"
    d.mkdir()
    weights = {f"model.layers.{i}.mlp.weight": mx.random.normal((40, 64), key=mx.random.key(i)) for i in range(3)}
    weights["model.embed_tokens.weight"] = mx.random.normal((10, 64), key=mx.random.key(9))
    weights["model.norm.weight"] = mx.ones((64,))
    mx.save_safetensors(str(d / "model.safetensors"), weights, metadata={"format": "mlx"})
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": 3}))
    (d / "tokenizer.json").write_text("{}")
    (d / "notes.bin").write_bytes(b"not part of the model")
    return d


def test_chunks_tile_every_file_and_hash_its_bytes(model_dir):
    m = build_manifest(model_dir)
    assert {f.path for f in m.files} == {"config.json", "model.safetensors", "tokenizer.json"}
    layout = read_layout(model_dir / "model.safetensors")
    assert m.tensor_names() == {t.name for t in layout.tensors}
    big = m.tensor_chunks(["model.layers.0.mlp.weight"])
    assert len(big) == 3 and sum(c.length for c in big) == 40 * 64 * 4
    assert Manifest.from_json(m.to_json()) == m
    assert m.fingerprint == build_manifest(model_dir).fingerprint


def test_the_fingerprint_covers_every_byte(model_dir):
    before = build_manifest(model_dir).fingerprint
    data = bytearray((model_dir / "model.safetensors").read_bytes())
    data[-3] ^= 1
    (model_dir / "model.safetensors").write_bytes(bytes(data))
    assert build_manifest(model_dir).fingerprint != before


@pytest.mark.parametrize("edit", [
    lambda d: d["chunks"].pop(1),  # a gap
    lambda d: d["chunks"][0].update(file="../etc/passwd"),
    lambda d: d["files"][0].update(path="/etc/passwd"),
    lambda d: d["chunks"][2].update(length=10**12),
    lambda d: d.update(version=99),
    lambda d: d["chunks"][0].update(blake3="x"),
])
def test_malformed_manifests_are_refused(model_dir, edit):
    d = json.loads(build_manifest(model_dir).to_json())
    edit(d)
    with pytest.raises(ManifestError):
        Manifest.from_json(json.dumps(d))


def test_the_manifest_is_hashed_once(model_dir, tmp_path, monkeypatch):
    first = cached_manifest(model_dir, tmp_path / "cache")
    monkeypatch.setattr(manifest_module, "build_manifest", lambda d: pytest.fail("hashed again"))
    assert cached_manifest(model_dir, tmp_path / "cache") == first


def test_a_partial_store_loads_its_tensors_and_survives_a_restart(model_dir, tmp_path):
    m = build_manifest(model_dir)
    source = ChunkStore.complete(model_dir, m)
    store = ChunkStore.partial(tmp_path / "copy", m)
    wanted = m.support_chunks() + m.tensor_chunks(["model.layers.1.mlp.weight"])
    for c in store.missing(wanted):
        store.write(c, source.read(c))
    store.save()
    again = ChunkStore.partial(tmp_path / "copy", m)
    assert again.missing(wanted) == [] and again.held() == {c.index for c in wanted}
    loaded = mx.load(str(tmp_path / "copy" / "model.safetensors"))
    original = mx.load(str(model_dir / "model.safetensors"))
    assert mx.array_equal(loaded["model.layers.1.mlp.weight"], original["model.layers.1.mlp.weight"])
    assert (tmp_path / "copy" / "config.json").read_text() == (model_dir / "config.json").read_text()


def test_bytes_that_do_not_match_are_never_held(model_dir, tmp_path):
    m = build_manifest(model_dir)
    store = ChunkStore.partial(tmp_path / "copy", m)
    chunk = m.tensor_chunks(["model.norm.weight"])[0]
    good = ChunkStore.complete(model_dir, m).read(chunk)
    with pytest.raises(ChunkRejected):
        store.write(chunk, good[:-1] + bytes([good[-1] ^ 1]))
    assert not store.has(chunk)
    with pytest.raises(PermissionError):
        ChunkStore.complete(model_dir, m).write(chunk, good)


def test_a_chunk_written_as_it_comes_is_held_only_if_all_its_pieces_hash_right(model_dir, tmp_path):
    m = build_manifest(model_dir)
    store = ChunkStore.partial(tmp_path / "copy", m)
    chunk = max(m.chunks, key=lambda c: c.length)
    good = ChunkStore.complete(model_dir, m).read(chunk)
    pieces = lambda data: (memoryview(data)[i:i + 1000] for i in range(0, len(data), 1000))  # noqa: E731
    for bad in (good[:-1] + bytes([good[-1] ^ 1]), good[:-1]):  # one bit altered; one byte short
        with pytest.raises(ChunkRejected):
            store.write_as_it_comes(chunk, pieces(bad))
        assert not store.has(chunk)
    store.write_as_it_comes(chunk, pieces(good))
    assert store.has(chunk) and store.read(chunk) == good


def test_a_range_has_one_writer_at_a_time_and_none_once_held(model_dir, tmp_path):
    """A holder's second link can still deliver a chunk its first link's failure handed to another holder:
    the later arrival is read and dropped, so bad bytes never land over a chunk another link is writing
    or has written."""
    m = build_manifest(model_dir)
    store = ChunkStore.partial(tmp_path / "copy", m)
    chunk = max(m.chunks, key=lambda c: c.length)
    good = ChunkStore.complete(model_dir, m).read(chunk)
    bad = bytes(b ^ 0xFF for b in good)
    second: list[bool] = []

    def liar_with_an_honest_link_beside_it():
        yield memoryview(bad)[:100]
        second.append(store.write(chunk, good))  # arrives meanwhile on another link
        yield memoryview(bad)[100:]
    with pytest.raises(ChunkRejected):
        store.write_as_it_comes(chunk, liar_with_an_honest_link_beside_it())
    assert second == [False] and not store.has(chunk)
    assert store.write(chunk, good) and store.has(chunk)
    assert store.write(chunk, bad) is False  # held: a late liar changes nothing
    assert store.read(chunk) == good and (tmp_path / "copy" / chunk.file).read_bytes()[
        chunk.offset:chunk.offset + chunk.length] == good


def test_the_held_record_is_saved_by_time_not_after_every_few_chunks(model_dir, tmp_path, monkeypatch):
    from swarm.weights import store as store_module

    m = build_manifest(model_dir)
    source = ChunkStore.complete(model_dir, m)
    store = ChunkStore.partial(tmp_path / "copy", m)
    for chunk in m.chunks[:3]:
        store.write(chunk, source.read(chunk))
    store.wait_saved()
    assert not (tmp_path / "copy" / HELD_FILE).exists(), "saved (a sync of every file) within seconds of the start"
    monkeypatch.setattr(store_module, "_SAVE_EVERY_S", 0.0)
    store.write(m.chunks[3], source.read(m.chunks[3]))
    store.wait_saved()
    assert json.loads((tmp_path / "copy" / HELD_FILE).read_text())["chunks"] == [0, 1, 2, 3]


def test_a_dropped_arrival_leaves_the_chunk_to_the_link_writing_it(model_dir):
    m = build_manifest(model_dir)
    chunk = m.chunks[0]
    q = FetchQueue([chunk])
    q.add_holder("a", {chunk.index})
    q.add_holder("b", {chunk.index})
    assert q.take("b", 1 << 20) == [chunk]
    q.arrived(chunk, "a", accepted=None)  # a's late copy, while b writes it
    assert not q.done and not q.has_work_for("a"), "still b's"
    q.arrived(chunk, "b", accepted=False)  # b's bytes were bad: asked again, of a
    assert q.take("a", 1 << 20) == [chunk] and q.progress.done_bytes == 0


def test_the_queue_spreads_work_recovers_from_a_dead_holder_and_avoids_a_liar(model_dir):
    m = build_manifest(model_dir)
    chunks = m.tensor_chunks(m.tensor_names())
    q = FetchQueue(chunks)
    everything = {c.index for c in chunks}
    q.add_holder("a", everything)
    q.add_holder("b", everything)
    a, b = q.take("a", 8192), q.take("b", 8192)
    assert a and b and not {c.index for c in a} & {c.index for c in b}
    q.remove_holder("a")  # died mid-transfer: its chunks are free again
    for c in b:
        q.arrived(c, "b", accepted=True)
    liar = []
    while batch := q.take("b", 10**9):  # fair shares: several batches
        liar += batch
    assert {c.index for c in liar} == everything - {c.index for c in b}
    q.arrived(liar[0], "b", accepted=False)  # tampered
    for c in liar[1:]:
        q.arrived(c, "b", accepted=True)
    assert not q.done and q.stuck() == [liar[0]]
    assert q.take("b", 10**9) == []
    q.add_holder("c", {liar[0].index})
    assert q.stuck() == [] and q.take("c", 1) == [liar[0]]
    q.arrived(liar[0], "c", accepted=True)
    assert q.done and q.progress.done_bytes == q.progress.total_bytes and q.progress.rejected == 1


def _older_build_manifest(model_dir, m: Manifest) -> str:
    """`m` as a build of manifest version 1 wrote it: a sha256 per chunk."""
    d = json.loads(m.to_json())
    d["version"] = 1
    for c in d["chunks"]:
        with open(model_dir / c["file"], "rb") as f:
            f.seek(c["offset"])
            c["sha256"] = hashlib.sha256(f.read(c["length"])).hexdigest()
        del c["blake3"]
    return json.dumps(d, separators=(",", ":"), sort_keys=True)


def test_a_manifest_of_an_older_build_is_refused_by_name(model_dir):
    m = build_manifest(model_dir)
    first = m.chunks[0]
    assert first.blake3 == blake3.blake3((model_dir / first.file).read_bytes()[:first.length]).hexdigest()
    older = _older_build_manifest(model_dir, m)
    with pytest.raises(ManifestError, match=r"version 1 \(sha256 chunk hashes: a node of an older build\)"):
        Manifest.from_json(older)
    # and its fingerprint (what peers advertise) is another model's: the two builds never plan together
    assert hashlib.sha256(older.encode()).hexdigest()[:32] != m.fingerprint


def test_a_cached_manifest_of_sha256_chunks_is_made_again(model_dir, tmp_path):
    cache = tmp_path / "cache"
    m = cached_manifest(model_dir, cache)
    [path] = (cache / "manifests").iterdir()
    path.write_text(_older_build_manifest(model_dir, m))  # what the older build left in the cache
    assert cached_manifest(model_dir, cache) == m
    assert json.loads(path.read_text())["version"] == manifest_module.MANIFEST_VERSION


def test_a_fetched_copy_recorded_under_an_older_builds_fingerprint_holds_nothing(model_dir, tmp_path):
    m = build_manifest(model_dir)
    source = ChunkStore.complete(model_dir, m)
    store = ChunkStore.partial(tmp_path / "copy", m)
    for c in m.chunks:
        store.write(c, source.read(c))
    store.save()
    record = json.loads((tmp_path / "copy" / HELD_FILE).read_text())
    record["fingerprint"] = hashlib.sha256(_older_build_manifest(model_dir, m).encode()).hexdigest()[:32]
    (tmp_path / "copy" / HELD_FILE).write_text(json.dumps(record))
    assert ChunkStore.partial(tmp_path / "copy", m).held() == set()  # fetched again, verified anew


def test_the_fingerprint_is_computed_once_per_manifest(model_dir, monkeypatch):
    # Every node compares each peer's fingerprint with its own on every link-meter tick and profile: a
    # fingerprint serialized and hashed the whole manifest each time (a 32-node swarm of a 32-layer model
    # spent 40 % of every node's CPU on it).
    manifest = build_manifest(model_dir)
    calls = []
    to_json = Manifest.to_json
    monkeypatch.setattr(Manifest, "to_json", lambda self: calls.append(1) or to_json(self))
    first = manifest.fingerprint
    assert [manifest.fingerprint for _ in range(100)] == [first] * 100
    assert len(calls) == 1
    assert first == hashlib.sha256(to_json(manifest).encode()).hexdigest()[:32]
