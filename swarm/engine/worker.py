"""One dedicated thread for all MLX work of a node, which also serves the data lane's sockets.

MLX streams and lazy graphs are not meant to be shared between threads, and the
event loop must stay free for HTTP and discovery while a stage computes. The
thread waits in select() on a wake-up socket (jobs from the event loop) and on
the sockets the data lane gave it (transport/lane.py), so a frame for our
stage is read, computed and sent on by this thread alone. When it falls idle
after work, it tidies the heap before a hop has to (see _merge_freed_blocks).
It records when it works (busy_spans.py): how long a frame read now may have waited behind work.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import selectors
import socket
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable, TypeVar

from .busy_spans import SLIGHT_S, BusySpans

T = TypeVar("T")
log = logging.getLogger(__name__)

TIDY_AFTER_S = 0.002  # idle this long after work: tidy the heap (see _merge_freed_blocks)
# Rounds of work (what the thread does between two waits in select) of at least KEEP_ROUNDS_OVER_S are kept
# ROUNDS_KEPT_S, for longest_round.
KEEP_ROUNDS_OVER_S = 0.05
ROUNDS_KEPT_S = 10.0


class MlxWorker:
    def __init__(self, tidy_heap: bool = True) -> None:
        """tidy_heap: tidy the heap when the thread falls idle (CPU-only tuning, swarm/backend.py)."""
        self._tidy_heap = tidy_heap
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, (self._run_jobs, None))
        self._jobs: deque[tuple[Callable, tuple, Future | None]] = deque()
        self._after_events: list[Callable[[], None]] = []
        self._closing = False
        self._untidy = False
        self._recheck_at: float | None = None  # mlx_recheck_at's
        self._round_since: float | None = None  # when the round of work under way began (None: waiting for work)
        self._long_rounds: deque[tuple[float, float]] = deque(maxlen=256)  # (ended, seconds) of rounds kept
        self._busy = BusySpans(time.monotonic())  # MLX thread only
        self._thread = threading.Thread(target=self._serve, name="mlx", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def on_thread(self) -> bool:
        return threading.get_ident() == self._thread.ident

    # -- from any thread --------------------------------------------------
    def longest_round(self) -> float:
        """Seconds of this thread's longest round of work in the last ROUNDS_KEPT_S, the one under way
        included. The data lane is read between rounds only, so a peer asks it of a node that does not
        answer a probe (node/mlx_rounds.py)."""
        now, since = time.monotonic(), self._round_since
        longest = 0.0 if since is None else max(0.0, now - since)
        for ended, took in list(self._long_rounds):
            if ended >= now - ROUNDS_KEPT_S:
                longest = max(longest, took)
        return longest

    def submit(self, fn: Callable[..., T], *args) -> Future:
        """Run fn(*args) on the MLX thread; a concurrent Future of its result."""
        done: Future = Future()
        self._post(fn, args, done)
        return done

    def post(self, fn: Callable[..., object], *args) -> None:
        """Run fn(*args) on the MLX thread, without waiting; an exception is logged."""
        self._post(fn, args, None)

    async def run(self, fn: Callable[..., T], *args) -> T:
        return await asyncio.wrap_future(self.submit(fn, *args))

    def run_sync(self, fn: Callable[..., T], *args) -> T:
        return fn(*args) if self.on_thread else self.submit(fn, *args).result()

    def close(self) -> None:
        """Stop the thread after the job it is running; jobs not started are cancelled."""
        self._closing = True
        self._wake()
        if not self.on_thread:
            self._thread.join(timeout=5)

    # -- on the MLX thread ------------------------------------------------
    def watch(self, sock: socket.socket, on_readable: Callable[[], None] | None) -> None:
        """Call on_readable() whenever sock has data (None: stop watching it, for writing too)."""
        if on_readable is None:
            self._selector.unregister(sock)
        else:
            self._set(sock, 0, on_readable)

    def watch_writable(self, sock: socket.socket, on_writable: Callable[[], None] | None) -> None:
        """Call on_writable() whenever sock has room for more (None: stop; reading is watched on)."""
        self._set(sock, 1, on_writable)

    def _set(self, sock: socket.socket, which: int, callback: Callable[[], None] | None) -> None:
        try:
            key = self._selector.get_key(sock)
        except KeyError:
            key = None
        if key is not None and key.fileobj is not sock:
            # A socket closed while watched left its number behind, and a new one got it: the kernel
            # forgot the old watch with the close, so this one is registered afresh.
            self._selector.unregister(key.fileobj)
            key = None
        handlers = list(key.data) if key is not None else [None, None]
        handlers[which] = callback
        events = (selectors.EVENT_READ if handlers[0] else 0) | (selectors.EVENT_WRITE if handlers[1] else 0)
        if key is None:
            if events:
                self._selector.register(sock, events, tuple(handlers))
        elif events:
            self._selector.modify(sock, events, tuple(handlers))
        else:
            self._selector.unregister(sock)

    def mlx_worked(self) -> float:
        """Seconds this thread has worked so far: a clock that runs only while it works (busy_spans.py)."""
        return self._busy.worked(time.monotonic())

    def mlx_worked_since(self, then: float) -> float:
        """Seconds this thread worked since `then` (time.monotonic)."""
        return self._busy.worked_since(then, time.monotonic())

    def mlx_quiet(self, slight: float = SLIGHT_S) -> float:
        """How far back from now this thread worked at most `slight` seconds in all (busy_spans.py)."""
        return self._busy.quiet(time.monotonic(), slight)

    def mlx_take_in(self) -> None:
        """Between two passes of a run of work: handle what arrived meanwhile (frames, posted jobs)
        without waiting, so that it queues behind the work under way rather than after all of it. On
        a node that is its own next stage a request's steps follow each other on this thread, and new
        requests' prompts, posted by the event loop, waited for the stream to end (one node, 8 streams:
        the other seven waited out the first one's 64 tokens in about one run of three)."""
        for key, mask in self._selector.select(0):
            self._fire(key, mask)

    def after_events(self, fn: Callable[[], None]) -> None:
        """Call fn() after each round of socket events and jobs (to act on what they queued)."""
        self._after_events.append(fn)

    def mlx_recheck_at(self, deadline: float) -> None:
        """Run the after_events callbacks by `deadline` (time.monotonic) even if nothing arrives: for one
        that left work queued on purpose, to see whether more comes (stage_service.py's prompt gather)."""
        self._recheck_at = deadline if self._recheck_at is None else min(self._recheck_at, deadline)

    def _post(self, fn: Callable, args: tuple, done: Future | None) -> None:
        if self._closing:
            if done is not None:
                done.cancel()
            return
        self._jobs.append((fn, args, done))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the buffer is full of wake-ups already, or we are closed

    def _serve(self) -> None:
        while not self._closing:
            events = self._selector.select(self._wait_s())
            recheck = self._recheck_at is not None and time.monotonic() >= self._recheck_at
            if not events and not recheck:
                if self._untidy and self._tidy_heap:
                    self._untidy = False
                    self._busy.begin(time.monotonic())
                    _merge_freed_blocks()
                    self._busy.end(time.monotonic())
                continue
            self._round_since = time.monotonic()
            self._busy.begin(self._round_since)
            for key, mask in events:
                self._fire(key, mask)
            self._recheck_at = None  # a callback that still waits asks again
            for fn in self._after_events:
                self._call(fn)
            self._note_round(self._round_since)
            self._untidy = True
        for _, _, done in self._jobs:
            if done is not None:
                done.cancel()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _note_round(self, since: float) -> None:
        self._round_since = None
        now = time.monotonic()
        self._busy.end(now)
        if now - since >= KEEP_ROUNDS_OVER_S:
            while self._long_rounds and self._long_rounds[0][0] < now - ROUNDS_KEPT_S:
                self._long_rounds.popleft()
            self._long_rounds.append((now, now - since))

    def _wait_s(self) -> float | None:
        """How long select() may wait: until the heap tidy is due, or a recheck; else for ever."""
        wait = TIDY_AFTER_S if self._untidy and self._tidy_heap else None
        if self._recheck_at is not None:
            left = max(0.0, self._recheck_at - time.monotonic())
            wait = left if wait is None else min(wait, left)
        return wait

    def _run_jobs(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self._jobs and not self._closing:
            fn, args, done = self._jobs.popleft()
            if done is None:
                self._call(fn, *args)
            elif done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn(*args))
                except BaseException as e:  # delivered to the waiter
                    done.set_exception(e)

    def _fire(self, key: selectors.SelectorKey, mask: int) -> None:
        on_readable, on_writable = key.data
        if mask & selectors.EVENT_WRITE and on_writable is not None:
            self._call(on_writable)
            try:
                on_readable = self._selector.get_key(key.fileobj).data[0]  # (the write may have closed it)
            except (KeyError, ValueError):
                return
        if mask & selectors.EVENT_READ and on_readable is not None:
            self._call(on_readable)

    @staticmethod
    def _call(fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("on the MLX thread")


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        libc.gnu_get_libc_version  # noqa: B018  (glibc, not musl: only glibc merges this way)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _glibc()


def _merge_freed_blocks() -> None:
    """Let glibc merge the small blocks a forward pass freed now, while this thread is idle.

    A forward pass frees thousands of small MLX objects into glibc's fastbins; the
    thread's next malloc of 1 KiB or more merges them all first, which can take as long as
    the rest of a hop. Left alone, that lands on the next hop
    (reading or sending a frame); one such malloc in idle time takes it off the path.
    """
    if _LIBC is not None:
        _LIBC.free(_LIBC.malloc(4096))
