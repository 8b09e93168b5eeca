"""``s3fifo``: S3-FIFO as published (Yang et al., SOSP'23, and its authors' reference
simulator), and ``s3fifo-pagedkv``, this project's earlier variant.

Three FIFO queues over the free cached blocks: a small queue S, a main queue M and a
ghost queue G of recently evicted *keys* (no blocks). A freed block whose key is on G
enters M (the key leaves G); a block revived from M and freed again goes back to M; any
other block enters S. Each block counts its cache hits since it was cached (capped at 3
where it is read). Eviction takes from S while S holds at least 10% of the queued blocks
(or M is empty), else from M:

- from S, a block hit at least twice (``promote_min_hits``) moves to M's tail with its
  count cleared; any other is evicted and its key goes to G;
- from M, a block with hits left moves back to M's tail with one hit fewer; one without
  is evicted.

G holds as many keys as M can hold blocks (90% of the pool) and forgets the oldest
first. One-off prompts (a scan) thus pass through S without flushing reused blocks.

A block in the KV pool is evictable only while free: a hit takes it out of its queue and
the next free puts it back at the tail of its queue, where the paper's cache leaves a
hit object in place. Blocks freed with ``evict_first`` (dense retention's contract) sit
in a queue of their own that is emptied before S or M is looked at, the latest first;
their keys do not go to G. Every operation is amortized O(1).

``s3fifo-pagedkv`` differs in three rules: one hit promotes from S to M, the count is
kept on promotion, and G holds as many keys as the pool has blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from pagedkv.policies.base import EvictionPolicy, HitCounts
from pagedkv.policies.linked import LinkedQueue
from pagedkv.policies.registry import register_policy

__all__ = ["MAX_FREQ", "S3FIFOPagedKVPolicy", "S3FIFOPolicy"]

MAX_FREQ = 3
SMALL, MAIN, EARLY = 0, 1, 2


@register_policy("s3fifo")
class S3FIFOPolicy(EvictionPolicy):
    small_fraction = 0.1
    promote_min_hits = 2  # the paper's "accessed more than once" while in S
    clear_on_promotion = True
    ghost_fraction = 0.9  # G holds as many keys as M holds blocks
    uses_keys = True

    def __init__(self, num_blocks: int, ghost_size: int | None = None) -> None:
        super().__init__(num_blocks)
        self.queues = (LinkedQueue(), LinkedQueue(), LinkedQueue())
        self.freq = HitCounts()
        self.in_main: set[int] = set()
        self.keys: dict[int, Any] = {}
        self.ghost: OrderedDict[Any, None] = OrderedDict()
        default = int(num_blocks * self.ghost_fraction)
        self.ghost_size = max(1, default if ghost_size is None else ghost_size)

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues)

    def __contains__(self, block: int) -> bool:
        return any(block in q for q in self.queues)

    def push(self, block: int, priority: int = 0, key: Any = None) -> None:
        if key is not None:
            self.keys[block] = key
            if self.ghost.pop(key, _ABSENT) is not _ABSENT:
                self.in_main.add(block)
        self.queues[MAIN if block in self.in_main else SMALL].append(block)

    def push_early(self, block: int, key: Any = None) -> None:
        if key is not None:
            self.keys[block] = key
        self.queues[EARLY].appendleft(block)

    def _evict_from_small(self) -> bool:
        small = len(self.queues[SMALL])
        main = len(self.queues[MAIN])
        return small > 0 and (small >= self.small_fraction * (small + main) or not main)

    def pop(self) -> int:
        if not len(self):
            raise IndexError(f"pop from an empty {type(self).__name__}")
        early = self.queues[EARLY]
        if early:
            block = early.popleft()
            self.keys.pop(block, None)
            return block
        main = self.queues[MAIN]
        freq = self.freq
        while True:
            region = SMALL if self._evict_from_small() else MAIN
            block = self.queues[region].popleft()
            count = freq.get(block, 0)
            if region == SMALL and count < self.promote_min_hits:
                break
            if region == MAIN and count == 0:
                break
            if region == SMALL:
                self.in_main.add(block)
                if self.clear_on_promotion:
                    del freq[block]
            elif count > 1:
                freq[block] = min(count, MAX_FREQ) - 1
            else:
                del freq[block]
            main.append(block)
        freq.pop(block, None)
        key = self.keys.pop(block, None)
        self.in_main.discard(block)
        if region == SMALL and key is not None and key not in self.ghost:
            self.ghost[key] = None
            if len(self.ghost) > self.ghost_size:
                self.ghost.popitem(last=False)
        return block

    def remove(self, block: int) -> None:
        region = next(r for r in (SMALL, MAIN, EARLY) if block in self.queues[r])
        self.queues[region].remove(block)

    def hit(self, block: int) -> None:
        self.freq.hit(block)

    def forget(self, block: int) -> None:
        self.freq.pop(block, None)
        self.in_main.discard(block)
        self.keys.pop(block, None)


@register_policy("s3fifo-pagedkv")
class S3FIFOPagedKVPolicy(S3FIFOPolicy):
    """The earlier variant: one hit promotes from S, promotion keeps the count, and G
    holds as many keys as the pool has blocks."""

    promote_min_hits = 1
    clear_on_promotion = False
    ghost_fraction = 1.0


_ABSENT = object()
