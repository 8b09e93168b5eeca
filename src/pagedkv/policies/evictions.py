"""``RecordingFreeQueue``: wraps any free queue and records the cached blocks it hands
out (the device pool's evictions), so the host tier can store them before they are
overwritten. A pop's records are kept once its allocation commits (``defer``: the pool's
``on_commit``), so a rolled-back pop leaves none and ``unpop`` only forwards."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pagedkv.runtime.free_queue import FreeQueue

__all__ = [
    "RecordingFreeQueue",
]


class RecordingFreeQueue(FreeQueue):
    """``key_of(block)``: the block's key, None when it holds nothing cached; ``defer``:
    the pool's ``on_commit`` (both bound to the pool once it exists; no ``defer``: records
    are kept at once)."""

    def __init__(
        self,
        inner: FreeQueue,
        key_of: Callable[[int], Any] | None = None,
        defer: Callable[..., None] | None = None,
    ) -> None:
        self.inner = inner
        self.key_of = key_of
        self.defer = defer
        self.wants_hits = inner.wants_hits  # type: ignore[misc]
        self.evicted: list[tuple[int, Any]] = []  # (device block, key), oldest first

    def take_evicted(self) -> list[tuple[int, Any]]:
        evicted, self.evicted = self.evicted, []
        return evicted

    def __len__(self) -> int:
        return len(self.inner)

    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        blocks, token = self.inner.pop(num_blocks)
        key_of = self.key_of
        if key_of is not None:
            records = [(block, key) for block in blocks if (key := key_of(block)) is not None]
            if records:
                if self.defer is None:
                    self.evicted += records
                else:
                    self.defer(self.evicted.extend, records)
        return blocks, token

    def unpop(self, blocks: list[int], token: Any) -> None:
        self.inner.unpop(blocks, token)

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        self.inner.push_uncached(blocks, priority)

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        self.inner.push_cached(blocks, priority, evict_first)

    def remove(self, block: int) -> Any:
        return self.inner.remove(block)

    def remove_many(self, blocks: Sequence[int]) -> list[Any]:
        return self.inner.remove_many(blocks)

    def reinsert(self, block: int, token: Any) -> None:
        self.inner.reinsert(block, token)

    def hit(self, block: int) -> None:
        self.inner.hit(block)

    def order(self) -> list[int]:
        return self.inner.order()
