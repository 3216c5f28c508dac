"""What packing a hop's frame costs right after a forward pass: plain, sealed, sealed into kept buffers.

    python benchmarks/seal_after_forward.py [--model DIR] [--layers 2] [--steps 400]

On a hop the sender packs (and with a swarm secret seals) the frame right after its
forward pass, with its caches cold and glibc's fastbins full of the blocks the pass
freed (benchmarks/post_forward_malloc.py: the thread's next malloc of 1 KiB or more
merges them all). This times, after each decode step of one stage, one of: the plain
frame (frames.encode_frame), the frame sealed the allocating way (seal_frame: the
ciphertext is a new bytes object), sealed into the sealer's kept buffers (seal_frame
reuse=True, as connection.py does), the same bytes in the fewest Python steps (lean_sealer), then a malloc of
1100 bytes after each (what is left of the merge). Steps rotate through the ways, so
all see the same machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

from swarm.engine.shard import load_shard  # noqa: E402
from swarm.engine.shard_runner import ShardRunner  # noqa: E402
from swarm.models.resolve import resolve_model  # noqa: E402
from swarm.transport.arrays import encode_array  # noqa: E402
from swarm.transport.frames import PREFIX, encode_frame, pack_header  # noqa: E402
from swarm.transport.link_crypto import TAG_BYTES, FrameSealer  # noqa: E402
from swarm.transport.sealed_frames import seal_frame  # noqa: E402


class _TwoBufferSealer(FrameSealer):
    """The data lane's way before: parts joined into one kept buffer, sealed into a second."""

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self._plain, self._sealed = bytearray(), bytearray()

    def seal_frame(self, header: dict, payload) -> list:
        packed = pack_header(header)
        n = memoryview(payload).nbytes
        prefix = PREFIX.pack(len(packed) + TAG_BYTES, n)
        views = [memoryview(p).cast("B") for p in (packed, payload)]
        total = sum(v.nbytes for v in views)
        if len(self._plain) < total:
            self._plain, self._sealed = bytearray(2 * total), bytearray(2 * total + TAG_BYTES)
        plain, at = memoryview(self._plain), 0
        for view in views:
            plain[at:at + view.nbytes] = view
            at += view.nbytes
        sealed = memoryview(self._sealed)[:total + TAG_BYTES]
        self._aead.encrypt_into(self._next_nonce(), plain[:total], prefix, sealed)
        return [prefix, sealed]


def lean_sealer(key: bytes, keep_packer: bool = True):
    """The same sealed frame (protocol 3's joined shape, same bytes) in as few Python steps as it can
    be: one flat function, everything it calls bound beforehand, msgpack's packer kept. What the
    Python around the AEAD call costs cold (measurement only: no header checks)."""
    import msgpack
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from swarm.transport.link_crypto import _COUNTER
    encrypt_into, nonce_of, prefix_of = AESGCM(key).encrypt_into, _COUNTER.pack, PREFIX.pack
    packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack if keep_packer else pack_header
    buffer = memoryview(bytearray(1 << 16))
    sent = [0]

    def seal(header: dict, payload) -> list:
        packed = packb(header)
        h = len(packed)
        view = memoryview(payload).cast("B")
        n = h + view.nbytes
        prefix = prefix_of(h + TAG_BYTES, view.nbytes)
        buffer[:h] = packed
        buffer[h:n] = view
        sealed = buffer[:n + TAG_BYTES]
        encrypt_into(nonce_of(sent[0]), buffer[:n], prefix, sealed)
        sent[0] += 1
        return [prefix, sealed]
    return seal


def middle_stage(model_arg: str | None, layers: int):
    """A middle stage of `layers` layers of the model (float32, as a node runs it) with a request's
    150-position prompt cached: (the resolved model, the stage, its width). What a hop's seal follows
    (aead_cold.py too)."""
    model = resolve_model(model_arg)
    hidden = model.config["hidden_size"]
    start = max(1, (model.n_layers - layers) // 2)
    stage = ShardRunner(load_shard(model.path, start, start + layers, mx.float32))
    stage.forward("r", mx.random.normal((1, 150, hidden)), 0)
    return model, stage, hidden


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--layers", type=int, default=2, help="layers of the (middle) stage")
    p.add_argument("--steps", type=int, default=400)
    args = p.parse_args()
    model, stage, hidden = middle_stage(args.model, args.layers)
    sealers = [FrameSealer(bytes([i]) * 32) for i in range(3)]
    before = _TwoBufferSealer(bytes([9]) * 32)
    ways = {
        "plain (encode_frame)": lambda h, d: encode_frame(h, d),
        "sealed, allocating": lambda h, d: seal_frame(sealers[0], h, d),
        "sealed into two kept buffers (3e, before)": lambda h, d: before.seal_frame(h, d),
        "sealed in place in one kept buffer (now)": lambda h, d: seal_frame(sealers[1], h, d, reuse=True),
        "the same, fewest Python steps (lean_sealer)": lean_sealer(bytes([7]) * 32),
        "the same, fewest steps, header by pack_header": lean_sealer(bytes([8]) * 32, keep_packer=False),
    }
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ways}
    pos = 150
    for step in range(args.steps):
        name = list(ways)[step % len(ways)]
        x = mx.random.normal((1, 1, hidden))
        mx.eval(x)
        y = stage.forward("r", x, pos)
        mx.eval(y)
        dtype, shape, data = encode_array(y)
        header = {"t": "fwd", "r": "r-0123456789abcdef", "p": "p-01234567", "pos": pos, "n": 1, "e": "entry-node",
                  "d": dtype, "s": shape, "c": 0.0012}
        t0 = time.perf_counter()
        ways[name](header, data)
        t1 = time.perf_counter()
        bytearray(1100)
        t2 = time.perf_counter()
        pos += 1
        if step >= 6 * len(ways):
            times[name][0].append((t1 - t0) * 1e6)
            times[name][1].append((t2 - t1) * 1e6)
    print(f"{model.model_id}: a {args.layers}-layer stage, float32, hidden {hidden} "
          f"({4 * hidden / 1e3:.1f} kB a frame), {args.steps} decode steps")
    print("| right after a forward pass | pack the frame, µs (median) | middle half | a 1100 B malloc after it, µs |")
    print("|---|---:|---:|---:|")
    for name, (pack, malloc) in times.items():
        q = statistics.quantiles(pack, n=4)
        print(f"| {name} | {statistics.median(pack):.1f} | {q[0]:.1f}-{q[2]:.1f} | {statistics.median(malloc):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
