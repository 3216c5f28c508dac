"""A model as the swarm knows it: every file, cut into hashed chunks; its fingerprint covers them all.

Weight files are cut along tensors (a tensor of more than CHUNK_BYTES into several
chunks), so a stage fetches exactly the tensors of its layers, and every chunk is
verified on arrival. Other files (config, tokenizer, headers of weight files) are
chunks too. Two nodes agree on a model when their fingerprints are equal, and then
on every byte of it.

Each chunk's hash is BLAKE3 (32 bytes): ~5.8 GB/s on one core here against SHA-256's
~1.4, and the fetcher hashes every byte it receives. The fingerprint itself is
SHA-256 over the manifest's small JSON (any 256-bit hash would do there; keeping it
keeps the fingerprint's form). Hashing a model reads all of it once; the result is
kept in the cache under a key of the files' names, sizes and modification times.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable

import blake3

from .safetensors_header import read_layout

log = logging.getLogger(__name__)

CHUNK_BYTES = 16 * 1024 * 1024
# Says which hash the chunks carry, and is hashed into the fingerprint: nodes of builds that hash differently
# never agree on a model, and a manifest of another version is refused by name. 1: sha256; 2: blake3.
MANIFEST_VERSION = 2
# What a model directory holds that a node needs: weights, configs, tokenizers, chat templates.
MODEL_FILE_SUFFIXES = {".safetensors", ".json", ".model", ".txt", ".jinja", ".tiktoken"}


class ManifestError(ValueError):
    """A manifest that is malformed or does not describe the files it claims to."""


@dataclass(frozen=True)
class Chunk:
    index: int
    file: str  # path relative to the model directory
    offset: int
    length: int
    blake3: str  # hex digest of the chunk's bytes
    tensor: str = ""  # "" for a non-tensor chunk: a file header or a whole small file


@dataclass(frozen=True)
class ModelFile:
    path: str
    size: int


@dataclass(frozen=True)
class Manifest:
    files: tuple[ModelFile, ...]
    chunks: tuple[Chunk, ...]

    @cached_property
    def fingerprint(self) -> str:
        # Kept (the manifest is frozen): every node compares it with each peer's on every profile and
        # link-meter tick, and serializing the whole manifest each time grew with peers times chunks.
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:32]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def tensor_chunks(self, names: Iterable[str]) -> list[Chunk]:
        wanted = set(names)
        return [c for c in self.chunks if c.tensor in wanted]

    def support_chunks(self) -> list[Chunk]:
        """What every node needs besides tensors: configs, tokenizer, weight file headers."""
        return [c for c in self.chunks if not c.tensor]

    def tensor_names(self) -> set[str]:
        return {c.tensor for c in self.chunks if c.tensor}

    def to_json(self) -> str:
        return json.dumps({"version": MANIFEST_VERSION, "files": [asdict(f) for f in self.files],
                           "chunks": [asdict(c) for c in self.chunks]}, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Manifest":
        try:
            d = json.loads(text)
            if d.get("version") != MANIFEST_VERSION:
                older = " (sha256 chunk hashes: a node of an older build)" if d.get("version") == 1 else ""
                raise ManifestError(f"manifest version {d.get('version')!r}{older}, expected {MANIFEST_VERSION} "
                                    "(blake3 chunk hashes)")
            files = tuple(ModelFile(str(f["path"]), int(f["size"])) for f in d["files"])
            chunks = tuple(Chunk(int(c["index"]), str(c["file"]), int(c["offset"]), int(c["length"]),
                                 str(c["blake3"]), str(c.get("tensor", ""))) for c in d["chunks"])
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ManifestError(f"malformed manifest: {e}") from None
        manifest = cls(files, chunks)
        manifest.check()
        return manifest

    def check(self) -> None:
        """Every chunk lies inside its file, chunks tile each file exactly, paths stay inside the model dir."""
        sizes = {f.path: f.size for f in self.files}
        for f in self.files:
            if not _safe_relative(f.path) or f.size < 0:
                raise ManifestError(f"bad file entry {f.path!r}")
        covered: dict[str, int] = dict.fromkeys(sizes, 0)
        for i, c in enumerate(self.chunks):
            if c.index != i or c.file not in sizes or len(c.blake3) != 64:
                raise ManifestError(f"bad chunk {i}: {c}")
            if c.offset != covered[c.file] or c.length <= 0 or c.offset + c.length > sizes[c.file]:
                raise ManifestError(f"chunk {i} of {c.file} does not continue the file at {covered[c.file]}")
            covered[c.file] = c.offset + c.length
        for path, size in sizes.items():
            if covered[path] != size:
                raise ManifestError(f"{path}: chunks cover {covered[path]} of {size} bytes")


def _safe_relative(path: str) -> bool:
    p = Path(path)
    return bool(path) and not p.is_absolute() and ".." not in p.parts and not path.startswith(".")


def model_files(model_dir: Path) -> list[Path]:
    return sorted(p for p in Path(model_dir).iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix in MODEL_FILE_SUFFIXES)


def build_manifest(model_dir: Path) -> Manifest:
    model_dir = Path(model_dir)
    files, pieces = [], []
    for path in model_files(model_dir):
        rel = path.name
        size = path.stat().st_size
        files.append(ModelFile(rel, size))
        if path.suffix == ".safetensors":
            layout = read_layout(path)
            spans = [(0, layout.header_bytes, "")]
            at = layout.header_bytes
            for t in layout.tensors:
                if t.start > at:  # padding between tensors belongs to no tensor
                    spans.append((at, t.start - at, ""))
                spans.extend((o, n, t.name) for o, n in _cut(t.start, t.nbytes))
                at = max(at, t.end)
            if at < size:
                spans.append((at, size - at, ""))
        else:
            spans = [(o, n, "") for o, n in _cut(0, size)]
        for (offset, length, tensor), digest in zip(spans, _hash_spans(path, spans)):
            pieces.append((rel, offset, length, digest, tensor))
    chunks = tuple(Chunk(i, *p) for i, p in enumerate(pieces))
    manifest = Manifest(tuple(files), chunks)
    manifest.check()
    return manifest


def _cut(start: int, length: int) -> list[tuple[int, int]]:
    return [(start + o, min(CHUNK_BYTES, length - o)) for o in range(0, length, CHUNK_BYTES)] if length else []


def _hash_spans(path: Path, spans: list[tuple[int, int, str]]) -> list[str]:
    """Each span's hash, read through a map of the file (no copy into a buffer: at blake3's speed the
    copy would cost as much as the hash)."""
    if not spans:
        return []
    size = path.stat().st_size
    end = max(o + n for o, n, _ in spans)
    if end > size:
        raise ManifestError(f"{path.name}: ends before byte {end}")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return [chunk_hash(view[o:o + n]) for o, n, _ in spans]
        finally:
            view.release()


def chunk_hash(data: bytes | memoryview) -> str:
    """A chunk's hash as the manifest holds it (any thread: blake3 lets go of the GIL while it hashes)."""
    return chunk_hasher(data).hexdigest()


def chunk_hasher(data: bytes | memoryview = b"") -> "blake3.blake3":
    """The hash of `chunk_hash`, to be fed piece by piece (`update`, then `hexdigest`)."""
    return blake3.blake3(data)


def cached_manifest(model_dir: Path, cache_root: Path) -> Manifest:
    """The model's manifest, hashed once per version of its files."""
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in model_files(model_dir)]
    # the version in the key: two builds on one machine keep a manifest each, not one re-hashed in turn
    named = [MANIFEST_VERSION, str(Path(model_dir).resolve()), stats]
    key = hashlib.sha256(json.dumps(named).encode()).hexdigest()[:32]
    path = Path(cache_root) / "manifests" / f"{key}.json"
    try:
        return Manifest.from_json(path.read_text())
    except (OSError, ManifestError):
        pass
    total = sum(s for _, s, _ in stats)
    log.log(logging.INFO if total > 4e9 else logging.DEBUG,  # ~1 s per 4 GB from the page cache: a line when long
            "hashing %s (%.1f GB) once, for the swarm's model fingerprint", model_dir, total / 1e9)
    manifest = build_manifest(model_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(manifest.to_json())
    tmp.replace(path)
    return manifest
