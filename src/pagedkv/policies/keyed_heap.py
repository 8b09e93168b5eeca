"""A min-heap of blocks by sort key, with O(log n) removal of any block by lazy deletion.

The order is a pure function of the live ``(key, block)`` pairs (ties: the smaller id).
"""

from __future__ import annotations

import heapq
from typing import Any

__all__ = [
    "KeyedHeap",
]


class KeyedHeap:
    __slots__ = ("_heap", "keys")

    def __init__(self) -> None:
        self._heap: list[tuple[Any, int]] = []
        self.keys: dict[int, Any] = {}  # live block -> its key

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, block: int) -> bool:
        return block in self.keys

    def push(self, block: int, key: Any) -> None:
        self.keys[block] = key
        heapq.heappush(self._heap, (key, block))

    def pop(self) -> tuple[int, Any]:
        """The block with the smallest key (ties: smaller id) and that key."""
        heap = self._heap
        keys = self.keys
        while heap:
            key, block = heapq.heappop(heap)
            if keys.get(block, _MISSING) == key:
                del keys[block]
                return block, key
        raise IndexError("pop from an empty KeyedHeap")

    def push_many(self, items: list[tuple[Any, int]]) -> None:
        """Push ``(key, block)`` pairs."""
        keys = self.keys
        heap = self._heap
        push = heapq.heappush
        for item in items:
            keys[item[1]] = item[0]
            push(heap, item)

    def pop_many(self, count: int) -> list[tuple[Any, int]]:
        """The ``count`` smallest ``(key, block)`` pairs, smallest first."""
        heap = self._heap
        keys = self.keys
        pop = heapq.heappop
        out: list[tuple[Any, int]] = []
        while len(out) < count:
            item = pop(heap)
            block = item[1]
            if keys.get(block, _MISSING) == item[0]:
                del keys[block]
                out.append(item)
        return out

    def remove(self, block: int) -> Any:
        """Drop ``block`` and return its key; its heap entry goes stale."""
        key = self.keys.pop(block)
        heap = self._heap
        if len(heap) > 2 * len(self.keys) + 64:
            self._heap = [(k, b) for b, k in self.keys.items()]
            heapq.heapify(self._heap)
        return key

    def clear(self) -> None:
        self._heap.clear()
        self.keys.clear()


_MISSING = object()
