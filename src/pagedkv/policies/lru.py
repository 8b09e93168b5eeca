"""``lru``: least recently freed first, uncached-free order aside (vLLM's order of the
cached part of its free queue). O(1); early-freed blocks go to the front."""

from __future__ import annotations

from typing import Any

from pagedkv.policies.base import EvictionPolicy
from pagedkv.policies.linked import LinkedQueue
from pagedkv.policies.registry import register_policy


@register_policy("lru")
class LRUPolicy(EvictionPolicy):
    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.queue = LinkedQueue()

    def __len__(self) -> int:
        return len(self.queue)

    def __contains__(self, block: int) -> bool:
        return block in self.queue

    def push(self, block: int, priority: int = 0, key: Any = None) -> None:
        self.queue.append(block)

    def push_early(self, block: int, key: Any = None) -> None:
        self.queue.appendleft(block)

    def pop(self) -> tuple[int, Any]:
        return self.queue.popleft(), None

    def unpop(self, block: int, token: Any) -> None:
        self.queue.appendleft(block)

    def remove(self, block: int) -> Any:
        return self.queue.remove(block)

    def restore(self, block: int, token: Any) -> None:
        self.queue.reinsert(block, token)

    def order(self) -> list[int]:
        return list(self.queue)
