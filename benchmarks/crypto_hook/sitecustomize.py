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

        def encode_frame(header, payload=b""):
            c, t = _cpu(), _now()
            out = encode(header, payload)
            t, c = _now() - t, _cpu() - c
            _note("pack", False, memoryview(payload).nbytes, t, c)
            return out

        def seal_frame(sealer, header, payload=b"", **kw):
            c, t = _cpu(), _now()
            out = seal(sealer, header, payload, **kw)
            t, c = _now() - t, _cpu() - c
            _note("pack", True, memoryview(payload).nbytes, t, c)
            return out

        def plain_take(self, view, header_len, payload_len, end):
            c, t = _cpu(), _now()
            out = take(self, view, header_len, payload_len, end)
            t, c = _now() - t, _cpu() - c
            _note("unpack", False, payload_len, t, c)
            return out

        def sealed_take(self, view, header_len, payload_len, end):
            c, t = _cpu(), _now()
            out = open_take(self, view, header_len, payload_len, end)
            t, c = _now() - t, _cpu() - c
            _note("unpack", True, payload_len, t, c)
            return out

        seal_into, open_ = link_crypto.FrameSealer.seal_into, link_crypto.FrameOpener.open

        def timed_seal_into(self, associated, header, payload):
            c, t = _cpu(), _now()
            out = seal_into(self, associated, header, payload)
            t, c = _now() - t, _cpu() - c
            _note("aead", True, payload.nbytes, t, c)
            return out

        def timed_open(self, associated, sealed):
            c, t = _cpu(), _now()
            out = open_(self, associated, sealed)
            t, c = _now() - t, _cpu() - c
            _note("aead-open", True, len(out), t, c)
            return out

        link_crypto.FrameSealer.seal_into, link_crypto.FrameOpener.open = timed_seal_into, timed_open
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
