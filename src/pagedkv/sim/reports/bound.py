"""The best any eviction policy could do: clairvoyant (Belady) caching of chained blocks.

The simulator logs, in order, every block the manager caches (``insert``) and every
first-admission prefix lookup (``lookup``). Replaying that log with a cache of the same
number of blocks that always evicts the block needed furthest in the future (and never
admits a block sooner evicted than kept) gives an upper bound: the real LRU pool is one
feasible policy on the same log. A block only counts if every block before it is cached.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from typing import Any, NamedTuple

from pagedkv.sim.traces.keys import chain_keys, full_sequence
from pagedkv.sim.traces.trace import TraceRequest

__all__ = [
    "AccessLog",
    "BoundResult",
    "belady_bound",
]

_INF = float("inf")
LOOKUP, INSERT = 0, 1


class AccessLog:
    """Ordered cache events of one simulation: ``(kind, request_index, a, b)`` tuples."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[tuple[int, int, int, int]] = []

    def lookup(self, request_index: int, max_hit_blocks: int, num_prompt_tokens: int) -> None:
        self.events.append((LOOKUP, request_index, max_hit_blocks, num_prompt_tokens))

    def insert(self, request_index: int, start_block: int, end_block: int) -> None:
        self.events.append((INSERT, request_index, start_block, end_block))


class BoundResult(NamedTuple):
    hit_tokens: int
    prompt_tokens: int
    capacity_blocks: int
    block_size: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class _Keys:
    """Per-request chain keys, computed on first use and dropped after the last event."""

    def __init__(
        self, requests: Sequence[TraceRequest], events: list[Any], block_size: int
    ) -> None:
        self.requests = requests
        self.block_size = block_size
        self.need: dict[int, int] = {}
        self.last: dict[int, int] = {}
        for t, (kind, r, a, b) in enumerate(events):
            self.need[r] = max(self.need.get(r, 0), a if kind == LOOKUP else b)
            self.last[r] = t
        self.live: dict[int, list[int]] = {}

    def get(self, r: int) -> list[int]:
        keys = self.live.get(r)
        if keys is None:
            seq = full_sequence(self.requests[r])
            keys = self.live[r] = chain_keys(seq, self.block_size, self.need[r])
        return keys

    def done(self, r: int, t: int) -> None:
        if self.last[r] == t:
            self.live.pop(r, None)


def _future_uses(
    requests: Sequence[TraceRequest], events: list[Any], block_size: int
) -> tuple[Any, ...]:
    """Lookup times per key, each lookup's chain cut at its first never-inserted block, and
    insert times per key."""
    keys = _Keys(requests, events, block_size)
    seen: set[int] = set()
    uses: dict[int, list[int]] = {}
    inserts: dict[int, list[int]] = {}
    effective: dict[int, int] = {}
    for t, (kind, r, a, b) in enumerate(events):
        chain = keys.get(r)
        if kind == INSERT:
            seen.update(chain[a:b])
            for key in chain[a:b]:
                inserts.setdefault(key, []).append(t)
        else:
            n = 0
            for key in chain[:a]:
                if key not in seen:
                    break
                uses.setdefault(key, []).append(t)
                n += 1
            effective[t] = n
        keys.done(r, t)
    return uses, effective, inserts


def belady_bound(
    requests: Sequence[TraceRequest], log: AccessLog, block_size: int, capacity_blocks: int
) -> BoundResult:
    """Hit tokens of a clairvoyant cache of ``capacity_blocks`` blocks on ``log``.

    Args:
        requests: the trace's requests.
        log: the lookups and insertions of the replayed schedule.
        block_size: tokens per block of the log.
        capacity_blocks: blocks the clairvoyant cache holds.
    """
    events = log.events
    uses, effective, inserts = _future_uses(requests, events, block_size)
    keys = _Keys(requests, events, block_size)
    pointer: dict[int, int] = {}
    cached: dict[int, tuple[float, int]] = {}  # key -> (next use, depth)
    heap: list[tuple[float, int, int]] = []
    hit_blocks = prompt_tokens = 0

    def next_use(key: int) -> float:
        times = uses.get(key)
        i = pointer.get(key, 0)
        return times[i] if times is not None and i < len(times) else _INF

    for t, (kind, r, a, b) in enumerate(events):
        chain = keys.get(r)
        if kind == LOOKUP:
            prompt_tokens += b
            n = effective[t]
            h = 0
            while h < n and chain[h] in cached:
                h += 1
            hit_blocks += h
            for depth in range(n):
                key = chain[depth]
                pointer[key] = pointer.get(key, 0) + 1
                if key in cached:
                    entry = (next_use(key), depth)
                    cached[key] = entry
                    heapq.heappush(heap, (-entry[0], -depth, key))
        else:
            for depth in range(a, b):
                key = chain[depth]
                if key in cached:
                    continue
                nu = next_use(key)
                if nu == _INF:
                    break
                if depth and chain[depth - 1] not in cached:
                    # Useless unless the parent comes in again before this block's next use.
                    times = inserts[chain[depth - 1]]
                    i = bisect.bisect_right(times, t)
                    if i == len(times) or times[i] > nu:
                        break
                if len(cached) >= capacity_blocks and not _evict_for(heap, cached, nu, depth):
                    break
                cached[key] = (nu, depth)
                heapq.heappush(heap, (-nu, -depth, key))
        keys.done(r, t)
    return BoundResult(hit_blocks * block_size, prompt_tokens, capacity_blocks, block_size)


def _evict_for(heap: list[Any], cached: dict[Any, Any], nu: float, depth: int) -> bool:
    """Evict the cached block used furthest ahead if that is later than ``(nu, depth)``."""
    while heap:
        neg_nu, neg_depth, key = heap[0]
        if cached.get(key) != (-neg_nu, -neg_depth):
            heapq.heappop(heap)
            continue
        if (-neg_nu, -neg_depth) <= (nu, depth):
            return False
        heapq.heappop(heap)
        del cached[key]
        return True
    return False
