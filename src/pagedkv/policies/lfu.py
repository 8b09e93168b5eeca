"""``lfu``: least frequently used first, with dynamic aging (LFU-DA).

A freed block's sort key is ``age + uses`` (uses: 1 + cache hits since it was cached),
ties broken by the order blocks were freed (oldest first); both are packed in one int
(``key << SEQ_BITS | sequence``) so heap comparisons stay cheap. ``age`` rises to the key of
each evicted block, so blocks that were popular long ago drift down to the newcomers and
get evicted in turn. O(log n) per operation (a heap with lazy deletion).
"""

from __future__ import annotations

from pagedkv.policies.base import SEQ_BITS, HitCounts
from pagedkv.policies.heap_policy import HeapPolicy
from pagedkv.policies.registry import register_policy

__all__ = [
    "LFUPolicy",
]


@register_policy("lfu")
class LFUPolicy(HeapPolicy):
    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._hits = HitCounts()
        self.age = 0

    def level(self, block: int, priority: int) -> int:
        return self.age + 1 + self._hits.get(block, 0)

    def pop(self) -> int:
        return self.pop_blocks(1)[0]

    def pop_blocks(self, count: int) -> list[int]:
        hits = self._hits
        blocks = []
        for key, block in self._heap.pop_many(count):
            hits.pop(block, None)
            uses = key >> SEQ_BITS
            if uses > self.age:
                self.age = uses
            blocks.append(block)
        return blocks

    def hit(self, block: int) -> None:
        self._hits.hit(block)

    def forget(self, block: int) -> None:
        self._hits.pop(block, None)
