"""``HeapPolicy``: the common part of the policies that evict the smallest key first.

Keys are ints, ``level << SEQ_BITS | sequence number`` (the level decides, the order of
freeing breaks ties), kept in a ``KeyedHeap``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.policies.base import EARLY_PRIORITY, SEQ_BITS, SEQ_MASK, EvictionPolicy
from pagedkv.policies.keyed_heap import KeyedHeap

__all__ = [
    "HeapPolicy",
]


class HeapPolicy(EvictionPolicy):
    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._heap = KeyedHeap()
        self._seq = 0

    def level(self, block: int, priority: int) -> int:
        """The sort level of ``block`` freed by a request of ``priority``."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, block: int) -> bool:
        return block in self._heap

    def push(self, block: int, priority: int = 0, key: Any = None) -> None:
        self._seq += 1
        self._heap.push(block, self.level(block, priority) << SEQ_BITS | self._seq)

    def push_blocks(self, blocks: Sequence[int], priority: int, keys: Sequence[Any]) -> None:
        seq = self._seq
        level = self.level
        items = []
        for block in blocks:
            seq += 1
            items.append((level(block, priority) << SEQ_BITS | seq, block))
        self._seq = seq
        self._heap.push_many(items)

    def push_early(self, block: int, key: Any = None) -> None:
        self._seq += 1  # the latest early block goes first
        self._heap.push(block, EARLY_PRIORITY << SEQ_BITS | (-self._seq & SEQ_MASK))

    def pop(self) -> int:
        return self._heap.pop()[0]

    def pop_blocks(self, count: int) -> list[int]:
        return [block for _, block in self._heap.pop_many(count)]

    def remove(self, block: int) -> None:
        self._heap.remove(block)
