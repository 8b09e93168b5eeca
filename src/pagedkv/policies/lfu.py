"""``lfu``: least frequently used first, with dynamic aging (LFU-DA).

A freed block's sort key is ``age + uses`` (uses: 1 + cache hits since it was cached),
ties broken by the order blocks were freed (oldest first); both are packed in one int
(``key << SEQ_BITS | sequence``) so heap comparisons stay cheap. ``age`` rises to the key of
each evicted block, so blocks that were popular long ago drift down to the newcomers and
get evicted in turn. O(log n) per operation (a heap with lazy deletion).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.policies.base import EARLY_PRIORITY, SEQ_BITS, SEQ_MASK, EvictionPolicy
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
        uses = self.age + 1 + self._hits.get(block, 0)
        self._heap.push(block, uses << SEQ_BITS | self._seq)

    def push_blocks(self, blocks: Sequence[int], priority: int, keys: Sequence[Any]) -> None:
        seq = self._seq
        base = self.age + 1
        hits = self._hits.get
        items = []
        for block in blocks:
            seq += 1
            items.append(((base + hits(block, 0)) << SEQ_BITS | seq, block))
        self._seq = seq
        self._heap.push_many(items)

    def pop_blocks(self, count: int) -> tuple[list[int], list[Any]]:
        hits = self._hits
        blocks = []
        tokens = []
        for key, block in self._heap.pop_many(count):
            tokens.append((key, self.age, hits.pop(block, 0)))
            uses = key >> SEQ_BITS
            if uses > self.age:
                self.age = uses
            blocks.append(block)
        return blocks, tokens

    def push_early(self, block: int, key: Any = None) -> None:
        self._seq += 1
        self._heap.push(block, EARLY_PRIORITY << SEQ_BITS | (-self._seq & SEQ_MASK))

    def pop(self) -> tuple[int, Any]:
        block, key = self._heap.pop()
        token = (key, self.age, self._hits.pop(block, 0))
        uses = key >> SEQ_BITS
        if uses > self.age:
            self.age = uses
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
