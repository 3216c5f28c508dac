"""One dedicated thread for all MLX work of a node.

MLX streams and lazy graphs are not meant to be shared between threads, and the
event loop must stay free for networking and HTTP while a stage computes.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")


class MlxWorker:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx")

    async def run(self, fn: Callable[..., T], *args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def run_sync(self, fn: Callable[..., T], *args) -> T:
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
