"""``lfu``: least frequently used first, with dynamic aging (LFU-DA).

A freed block's sort key is ``age + uses`` (uses: 1 + cache hits since it was cached),
ties broken by the order blocks were freed (oldest first). ``age`` rises to the key of
each evicted block, so blocks that were popular long ago drift down to the newcomers and
get evicted in turn. O(log n) per operation (a heap with lazy deletion).
"""

from __future__ import annotations

from typing import Any

from pagedkv.policies.base import EARLY_PRIORITY, EvictionPolicy
from pagedkv.policies.keyed_heap import KeyedHeap
from pagedkv.policies.registry import register_policy


@register_policy("lfu")
class LFUPolicy(EvictionPolicy):
    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._heap = KeyedHeap()
        self._hits: dict[int, int] = {}
        self._seq = 0
        self.age = 0

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, block: int) -> bool:
        return block in self._heap

    def push(self, block: int, priority: int = 0, key: Any = None) -> None:
        self._seq += 1
        self._heap.push(block, (self.age + 1 + self._hits.get(block, 0), self._seq))

    def push_early(self, block: int, key: Any = None) -> None:
        self._seq += 1
        self._heap.push(block, (EARLY_PRIORITY, -self._seq))

    def pop(self) -> tuple[int, Any]:
        block, key = self._heap.pop()
        token = (key, self.age, self._hits.pop(block, 0))
        if key[0] > self.age:
            self.age = key[0]
        return block, token

    def unpop(self, block: int, token: Any) -> None:
        key, self.age, hits = token
        if hits:
            self._hits[block] = hits
        self._heap.push(block, key)

    def remove(self, block: int) -> Any:
        return self._heap.remove(block)

    def restore(self, block: int, token: Any) -> None:
        self._heap.push(block, token)

    def hit(self, block: int) -> None:
        self._hits[block] = self._hits.get(block, 0) + 1

    def unhit(self, block: int) -> None:
        hits = self._hits[block] - 1
        if hits:
            self._hits[block] = hits
        else:
            del self._hits[block]

    def forget(self, block: int) -> None:
        self._hits.pop(block, None)
