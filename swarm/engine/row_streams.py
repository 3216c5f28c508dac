"""A batched prompt pass cut by rows across CPU streams, so every core works through all of it.

On MLX's CPU backend only the matmuls use more than one core (OpenBLAS's threads); an element-wise
op runs on one thread, and its exp is scalar: in a prompt pass of 8 prompts x 189 positions of the
default model, the SiLU and the attention's softmax take ~60% of the time with the other core idle
(benchmarks/row_streams.py). The rows of a batch are independent, so the pass is cut into groups of
rows, each built on its own CPU stream (MLX runs each stream on its own thread) and evaluated layer
by layer in lockstep: one eval of two whole graphs runs them one after the other (MLX's evaluation
seems to bound the tasks it has in flight). Meanwhile OpenBLAS runs each call on its caller's
thread (two multi-threaded calls at once wait for each other's workers). Each row's arithmetic is the whole batch's: the same padding, the
same positions, a matmul's result does not depend on the rows beside it or on the thread count, so
the output is the same, bit for bit (tests/test_batch_prefill.py).

Only where that holds and pays: the CPU device, more than one core and more than one row, and a
BLAS that can run a call on its caller's thread alone: OpenBLAS (its thread count is set per pass) or
MLX's bundled reference BLAS (single-threaded). Elsewhere (a GPU, another BLAS) the pass is not cut.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from typing import Iterator

import mlx.core as mx

from .blas import BUNDLED_BLAS, blas_in_use


def row_groups(rows: int) -> list[tuple[int, int]]:
    """[start, end) of each group of rows to run on a stream of its own, or [] to run the pass whole."""
    groups = min(rows, _cores())
    if groups < 2 or mx.default_device() != mx.cpu or _single_threaded_calls() is None:
        return []
    size, extra = divmod(rows, groups)
    bounds, start = [], 0
    for g in range(groups):
        end = start + size + (g < extra)
        bounds.append((start, end))
        start = end
    return bounds


def streams(n: int) -> list:
    """n CPU streams: the default one, then streams kept for this (made once, reused)."""
    return [mx.default_stream(mx.cpu), *_extra_streams(n - 1)]


def evaluate_in_lockstep(layers: list[list[object]], outputs: list[mx.array]) -> None:
    """Evaluate the groups' graphs layer by layer: `layers[i]` holds each group's BatchKVCache of
    the i-th layer (its keys and values end that layer's part), then the outputs, with OpenBLAS
    on one thread per call."""
    with _single_threaded_calls()():
        for caches in layers:
            mx.eval([(c.keys, c.values) for c in caches])
        mx.eval(outputs)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (macOS)
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def _extra_streams(n: int) -> tuple:
    return tuple(mx.new_stream(mx.cpu) for _ in range(n))


@functools.lru_cache(maxsize=1)
def _openblas():
    """OpenBLAS's thread-count calls if it serves this process's BLAS (preloaded: blas.py), else None."""
    try:
        lib = ctypes.CDLL(None)
        get, set_ = lib.openblas_get_num_threads, lib.openblas_set_num_threads
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, []
    set_.restype, set_.argtypes = None, [ctypes.c_int]
    return get, set_


@functools.lru_cache(maxsize=1)
def _single_threaded_calls():
    """What makes this process's BLAS calls run on their callers' threads for a while, or None."""
    if _openblas() is not None:
        return _one_openblas_thread
    if blas_in_use() == BUNDLED_BLAS:
        return contextlib.nullcontext
    return None


@contextlib.contextmanager
def _one_openblas_thread() -> Iterator[None]:
    get, set_ = _openblas()
    before = get()
    set_(1)
    try:
        yield
    finally:
        set_(before)
