"""``priority``: the blocks of less important requests are evicted first, least recently
freed first within a priority (TensorRT-LLM's retention priorities).

A block carries the priority of the request that freed it last, in vLLM's convention
(``Request.priority``: lower value = more important), so the largest value goes first.
O(log n) per operation.
"""

from __future__ import annotations

from pagedkv.policies.heap_policy import HeapPolicy
from pagedkv.policies.registry import register_policy

__all__ = [
    "PriorityPolicy",
]


@register_policy("priority")
class PriorityPolicy(HeapPolicy):
    def level(self, block: int, priority: int) -> int:
        return -priority
