"""``priority``: the blocks of less important requests are evicted first, least recently
freed first within a priority (TensorRT-LLM's retention priorities).

A block carries the priority of the request that freed it last, in vLLM's convention
(``Request.priority``: lower value = more important), so the largest value goes first.
O(log n) per operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.policies.base import EARLY_PRIORITY, SEQ_BITS, SEQ_MASK, EvictionPolicy
from pagedkv.policies.keyed_heap import KeyedHeap
from pagedkv.policies.registry import register_policy


@register_policy("priority")
class PriorityPolicy(EvictionPolicy):
    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._heap = KeyedHeap()
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, block: int) -> bool:
        return block in self._heap

    def push(self, block: int, priority: int = 0, key: Any = None) -> None:
        self._seq += 1
        self._heap.push(block, -priority << SEQ_BITS | self._seq)

    def push_blocks(self, blocks: Sequence[int], priority: int, keys: Sequence[Any]) -> None:
        seq = self._seq
        level = -priority << SEQ_BITS
        self._heap.push_many([(level | (seq + i + 1), b) for i, b in enumerate(blocks)])
        self._seq = seq + len(blocks)

    def pop_blocks(self, count: int) -> tuple[list[int], list[Any]]:
        items = self._heap.pop_many(count)
        return [block for _, block in items], [key for key, _ in items]

    def push_early(self, block: int, key: Any = None) -> None:
        self._seq += 1
        self._heap.push(block, EARLY_PRIORITY << SEQ_BITS | (-self._seq & SEQ_MASK))

    def pop(self) -> tuple[int, Any]:
        return self._heap.pop()

    def unpop(self, block: int, token: Any) -> None:
        self._heap.push(block, token)

    def remove(self, block: int) -> Any:
        return self._heap.remove(block)

    def restore(self, block: int, token: Any) -> None:
        self._heap.push(block, token)
