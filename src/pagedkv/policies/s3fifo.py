"""``s3fifo``: S3-FIFO (Yang et al., SOSP'23), scan-resistant with three FIFO queues.

Freed blocks enter a small queue S (about 10% of the free cached blocks); a block
whose content was evicted recently (its key is on the ghost list G) or that already
earned a place in the main queue M enters M. Eviction takes from S while S holds at
least 10%: a block hit since it was cached moves to M, an untouched one is evicted and
its key goes to G. From M, a block with hits left is moved back to the tail with one
hit fewer (at most 3 count), one without is evicted. One-off prompts (a scan) thus pass
through S without flushing the blocks that are reused. Amortized O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from pagedkv.policies.base import EvictionPolicy, HitCounts
from pagedkv.policies.linked import LinkedQueue
from pagedkv.policies.registry import register_policy

MAX_FREQ = 3
SMALL, MAIN = 0, 1


@register_policy("s3fifo")
class S3FIFOPolicy(EvictionPolicy):
    small_fraction = 0.1
    uses_keys = True

    def __init__(self, num_blocks: int, ghost_size: int | None = None) -> None:
        super().__init__(num_blocks)
        self.queues = (LinkedQueue(), LinkedQueue())
        self.freq = HitCounts()
        self.in_main: set[int] = set()
        self.keys: dict[int, Any] = {}
        self.ghost: OrderedDict[Any, None] = OrderedDict()
        self.ghost_size = max(1, num_blocks if ghost_size is None else ghost_size)

    def __len__(self) -> int:
        return len(self.queues[SMALL]) + len(self.queues[MAIN])

    def __contains__(self, block: int) -> bool:
        return block in self.queues[SMALL] or block in self.queues[MAIN]

    def push(self, block: int, priority: int = 0, key: Any = None) -> None:
        if key is not None:
            self.keys[block] = key
            if self.ghost.pop(key, _ABSENT) is not _ABSENT:
                self.in_main.add(block)
        self.queues[MAIN if block in self.in_main else SMALL].append(block)

    def push_early(self, block: int, key: Any = None) -> None:
        if key is not None:
            self.keys[block] = key
        self.queues[SMALL].appendleft(block)

    def _evict_from_small(self) -> bool:
        small = len(self.queues[SMALL])
        return small > 0 and (small >= self.small_fraction * len(self) or not self.queues[MAIN])

    def pop(self) -> tuple[int, Any]:
        if not len(self):
            raise IndexError("pop from an empty S3FIFOPolicy")
        main = self.queues[MAIN]
        freq = self.freq
        moves: list[tuple[int, int, int]] = []
        while True:
            region = SMALL if self._evict_from_small() else MAIN
            block = self.queues[region].popleft()
            count = freq.get(block, 0)
            if count == 0:
                break
            moves.append((block, region, count))
            if region == SMALL:
                self.in_main.add(block)
            elif count > 1:
                freq[block] = min(count, MAX_FREQ) - 1
            else:
                del freq[block]
            main.append(block)
        key = self.keys.pop(block, None)
        was_main = block in self.in_main
        self.in_main.discard(block)
        dropped = None
        added = region == SMALL and key is not None and key not in self.ghost
        if added:
            self.ghost[key] = None
            if len(self.ghost) > self.ghost_size:
                dropped = self.ghost.popitem(last=False)[0]
        return block, (region, moves, key, was_main, added, dropped)

    def unpop(self, block: int, token: Any) -> None:
        region, moves, key, was_main, added, dropped = token
        if added:
            del self.ghost[key]
            if dropped is not None:
                self.ghost[dropped] = None
                self.ghost.move_to_end(dropped, last=False)
        if key is not None:
            self.keys[block] = key
        if was_main:
            self.in_main.add(block)
        self.queues[region].appendleft(block)
        main = self.queues[MAIN]
        for moved, src, count in reversed(moves):
            main.pop()
            self.freq[moved] = count
            if src == SMALL:
                self.in_main.discard(moved)
            self.queues[src].appendleft(moved)

    def remove(self, block: int) -> Any:
        region = MAIN if block in self.queues[MAIN] else SMALL
        return region, self.queues[region].remove(block)

    def restore(self, block: int, token: Any) -> None:
        region, neighbours = token
        self.queues[region].reinsert(block, neighbours)

    def hit(self, block: int) -> None:
        self.freq.hit(block)

    def unhit(self, block: int) -> None:
        self.freq.unhit(block)

    def forget(self, block: int) -> None:
        self.freq.pop(block, None)
        self.in_main.discard(block)
        self.keys.pop(block, None)


_ABSENT = object()
