"""``priority``: the blocks of less important requests are evicted first, least recently
freed first within a priority (TensorRT-LLM's retention priorities).

A block carries the priority of the request that freed it last, in vLLM's convention
(``Request.priority``: lower value = more important), so the largest value goes first.
O(log n) per operation.
"""

from __future__ import annotations

from typing import Any

from pagedkv.policies.base import EARLY_PRIORITY, EvictionPolicy
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
        self._heap.push(block, (-priority, self._seq))

    def push_early(self, block: int, key: Any = None) -> None:
        self._seq += 1
        self._heap.push(block, (EARLY_PRIORITY, -self._seq))

    def pop(self) -> tuple[int, Any]:
        return self._heap.pop()

    def unpop(self, block: int, token: Any) -> None:
        self._heap.push(block, token)

    def remove(self, block: int) -> Any:
        return self._heap.remove(block)

    def restore(self, block: int, token: Any) -> None:
        self._heap.push(block, token)
