"""Which chunk to ask which holder for next: pure bookkeeping, no I/O.

Each holder is served by its own worker that asks `take` for its next batch:
chunks it holds that nobody has asked for yet, rarest first (so a chunk only one
holder has is not left for last). A holder that dies mid-transfer gives its
batch back and the other workers pick it up; a holder that served bad bytes for
a chunk is never asked for that chunk again. The fetch is done when every chunk
is in, stuck when chunks are left that no live holder can give.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..models.manifest import Chunk


@dataclass
class FetchProgress:
    total_bytes: int
    done_bytes: int = 0
    received_bytes: int = 0  # everything that arrived, rejected bytes included
    rejected: int = 0


@dataclass
class FetchQueue:
    chunks: list[Chunk]
    holdings: dict[str, set[int]] = field(default_factory=dict)  # holder -> chunk indices it holds
    progress: FetchProgress = field(init=False)

    def __post_init__(self) -> None:
        self._pending = {c.index: c for c in self.chunks}
        self._taken: dict[int, str] = {}
        self._bad: dict[int, set[str]] = {}  # chunk -> holders that served wrong bytes for it
        self.progress = FetchProgress(sum(c.length for c in self.chunks))

    # -- holders ----------------------------------------------------------
    def add_holder(self, holder: str, held: set[int]) -> None:
        self.holdings[holder] = set(held)

    def remove_holder(self, holder: str) -> None:
        """It died or left: what it was sending goes back to the queue."""
        self.holdings.pop(holder, None)
        for index, by in list(self._taken.items()):
            if by == holder:
                del self._taken[index]

    # -- work -------------------------------------------------------------
    def take(self, holder: str, max_bytes: int) -> list[Chunk]:
        """The next batch for `holder` (at least one chunk if it can give any; empty if not).

        At most a fair share of what is left, so that every holder has work while there is any."""
        free = self._free_for(holder)
        left = sum(c.length for i, c in self._pending.items() if i not in self._taken)
        max_bytes = min(max_bytes, left // (2 * max(1, len(self.holdings))))
        free.sort(key=lambda c: (self._holders_of(c.index), c.index))
        batch, size = [], 0
        for c in free:
            if batch and size + c.length > max_bytes:
                break
            batch.append(c)
            size += c.length
            self._taken[c.index] = holder
        return batch

    def arrived(self, chunk: Chunk, holder: str, accepted: bool | None) -> None:
        """`accepted`: held; False: refused (never asked of this holder again); None: dropped, as its bytes
        came while another link wrote the same chunk or after it was held (store.py): if that other write
        fails, the chunk is still pending and is asked again."""
        self.progress.received_bytes += chunk.length
        if self._taken.get(chunk.index) == holder:
            del self._taken[chunk.index]
        if accepted:
            if self._pending.pop(chunk.index, None) is not None:
                self.progress.done_bytes += chunk.length
        elif accepted is False:
            self.progress.rejected += 1
            self._bad.setdefault(chunk.index, set()).add(holder)

    def give_back(self, chunks: list[Chunk], holder: str) -> None:
        """`holder` will not deliver these after all (its connection broke)."""
        for c in chunks:
            if self._taken.get(c.index) == holder:
                del self._taken[c.index]

    def has_work_for(self, holder: str) -> bool:
        return bool(self._free_for(holder))

    def _free_for(self, holder: str) -> list[Chunk]:
        held = self.holdings.get(holder, set())
        return [c for i, c in self._pending.items()
                if i not in self._taken and i in held and holder not in self._bad.get(i, ())]

    @property
    def done(self) -> bool:
        return not self._pending

    def stuck(self) -> list[Chunk]:
        """Chunks no live holder can give (none holds them, or all that do served bad bytes)."""
        return [c for i, c in self._pending.items()
                if not any(i in held and h not in self._bad.get(i, ()) for h, held in self.holdings.items())]

    def _holders_of(self, index: int) -> int:
        return sum(1 for held in self.holdings.values() if index in held)
