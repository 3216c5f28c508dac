"""Benchmark-only: times the seal and open of every peer frame inside real node processes.

Loaded by Python at start-up when this directory is on PYTHONPATH (benchmarks/hop_crypto.py
puts it there for the nodes it starts, with SWARM_CRYPTO_TIMING=<dir>). It wraps, in
swarm.transport.connection, the frame writer (whole, and the encode or seal inside it)
and the frame reader (whole, and the parser's take or open inside it), and appends
"what sealed bytes ns" lines to <dir>/<pid>.crypto every 256 samples. Without the
variable it does nothing; the product code has no hook of its own.
"""

import os

_DIR = os.environ.get("SWARM_CRYPTO_TIMING")

if _DIR:
    import sys
    import time

    _now = time.perf_counter_ns
    _cpu = time.thread_time_ns  # this thread's CPU time: wall - cpu is time not on a core (preempted, waiting)
    _lines: list[str] = []
    _sealed_now = [False]

    def _flush() -> None:
        with open(os.path.join(_DIR, f"{os.getpid()}.crypto"), "a") as f:
            f.write("".join(_lines))
        _lines.clear()

    def _note(what: str, sealed: bool, n: int, ns: int, cpu_ns: int = -1) -> None:
        _lines.append(f"{what} {int(sealed)} {n} {ns} {cpu_ns}\n")
        if len(_lines) >= 256:
            _flush()

    def _install() -> None:
        from swarm.transport import connection, frames, link_crypto, sealed_frames

        write, read = connection.PeerConnection.write_frame, connection.PeerConnection.read_frames
        encode, seal = connection.encode_frame, connection.seal_frame
        take, open_take = frames.FrameParser._take, sealed_frames.SealedFrameParser._take

        def write_frame(self, header, payload, timeout):
            t = _now()
            write(self, header, payload, timeout)
            _note("write", self.sealed, memoryview(payload).nbytes, _now() - t)

        def read_frames(self):
            t = _now()
            frames_ = read(self)
            _note("read", self.sealed, sum(memoryview(f.payload).nbytes for f in frames_ or ()), _now() - t)
            return frames_

        seal_into, open_ = link_crypto.FrameSealer.seal_into, link_crypto.FrameOpener.open
        open_kept = getattr(link_crypto.FrameOpener, "open_kept", None)  # the hop's open since stop 29

        def timed(fn, what: str, sealed: bool, size):
            """`fn`, timed (wall and this thread's CPU) and noted with size(args, result) bytes."""
            def wrapper(*args, **kw):
                c, t = _cpu(), _now()
                out = fn(*args, **kw)
                t, c = _now() - t, _cpu() - c
                _note(what, sealed, size(args, out), t, c)
                return out
            return wrapper

        def payload_bytes(i):
            return lambda args, out: memoryview(args[i]).nbytes if len(args) > i else 0

        encode_frame = timed(encode, "pack", False, payload_bytes(1))
        seal_frame = timed(seal, "pack", True, payload_bytes(2))
        plain_take = timed(take, "unpack", False, lambda args, out: args[3])
        sealed_take = timed(open_take, "unpack", True, lambda args, out: args[3])
        timed_seal_into = timed(seal_into, "aead", True, lambda args, out: args[3].nbytes)
        timed_open = timed(open_, "aead-open", True, lambda args, out: len(out))

        link_crypto.FrameSealer.seal_into, link_crypto.FrameOpener.open = timed_seal_into, timed_open
        if open_kept is not None:
            link_crypto.FrameOpener.open_kept = timed(open_kept, "aead-open", True, lambda args, out: args[1].nbytes)
        connection.PeerConnection.write_frame = write_frame
        connection.PeerConnection.read_frames = read_frames
        connection.encode_frame, connection.seal_frame = encode_frame, seal_frame
        frames.FrameParser._take = plain_take
        sealed_frames.SealedFrameParser._take = sealed_take

    class _AfterImport:
        """Installs the wrappers once swarm.transport.connection has been executed (sitecustomize
        runs before any import; the node also re-execs itself with a BLAS preloaded)."""

        def find_spec(self, name, path=None, target=None):
            if name != "swarm.transport.connection":
                return None
            from importlib.machinery import PathFinder
            sys.meta_path.remove(self)
            spec = PathFinder.find_spec(name, path)
            real_exec = spec.loader.exec_module

            def exec_module(module):
                real_exec(module)
                _install()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterImport())
