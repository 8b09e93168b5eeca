"""The best any eviction policy could do: clairvoyant (Belady) caching of chained blocks.

The simulator logs, in order, every block the manager caches (``insert``) and every
first-admission prefix lookup (``lookup``). Replaying that log with a cache of the same
number of blocks that always evicts the block needed furthest in the future (and never
admits a block sooner evicted than kept) gives an upper bound: the real LRU pool is one
feasible policy on the same log. A block only counts if every block before it is cached.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import repeat
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


class _Chains:
    """Per-request chain keys, computed once on first use and dropped after the request's
    last event."""

    def __init__(self, requests: Sequence[TraceRequest], events: list[Any], block_size: int):
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


class _Lookup(NamedTuple):
    keys: list[int]  # the chain up to its first block never inserted before
    next_uses: list[float]  # each key's next lookup after this one (inf: none)


class _Insert(NamedTuple):
    keys: list[int]  # the blocks inserted
    parent: int | None  # the block before the first one (None at depth 0)
    parent_next_insert: float  # the parent's first insertion after this event (inf: none)


def _prepare(
    requests: Sequence[TraceRequest], events: list[Any], block_size: int
) -> tuple[list[_Lookup | _Insert], dict[int, float]]:
    """Each event's keys with the future the bound needs there (a lookup's chain is cut at
    its first block never inserted before it), and each key's first lookup.

    Chain keys are computed once per request; the next uses and next insertions come from
    one pass backwards, so the replay reads them instead of searching per block."""
    chains = _Chains(requests, events, block_size)
    seen: set[int] = set()
    keys_of: list[list[int]] = []
    parents: dict[int, int] = {}  # insert event -> the key before its first block
    for t, (kind, r, a, b) in enumerate(events):
        chain = chains.get(r)
        if kind == INSERT:
            keys = chain[a:b]
            seen.update(keys)
            if a:
                parents[t] = chain[a - 1]
        else:
            n = 0
            for key in chain[:a]:
                if key not in seen:
                    break
                n += 1
            keys = chain[:n]
        keys_of.append(keys)
        chains.done(r, t)
    # Backwards: the next lookup of every key, and the next insertion of every parent.
    prepared: list[Any] = [None] * len(events)
    next_use: dict[int, float] = {}
    wanted = set(parents.values())
    next_insert: dict[int, float] = {}
    for t in range(len(events) - 1, -1, -1):
        keys = keys_of[t]
        if events[t][0] == INSERT:
            parent = parents.get(t)
            after = _INF if parent is None else next_insert.get(parent, _INF)
            prepared[t] = _Insert(keys, parent, after)
            for key in wanted.intersection(keys):
                next_insert[key] = t
        else:
            prepared[t] = _Lookup(keys, list(map(next_use.get, keys, repeat(_INF))))
            next_use.update(dict.fromkeys(keys, t))
    return prepared, next_use


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
    prepared, next_use = _prepare(requests, events, block_size)
    # next_use now holds each key's first lookup; each lookup moves its keys' on.
    cached: dict[int, tuple[float, int]] = {}  # key -> (next use, depth)
    heap: list[tuple[float, int, int]] = []
    hit_blocks = prompt_tokens = 0
    for (kind, _, a, b), step in zip(events, prepared, strict=True):
        keys = step.keys
        if kind == LOOKUP:
            assert isinstance(step, _Lookup)
            prompt_tokens += b
            h = 0
            for key in keys:
                if key not in cached:
                    break
                h += 1
            hit_blocks += h
            nexts = step.next_uses
            for depth, key in enumerate(keys):
                if key in cached:
                    nu = nexts[depth]
                    cached[key] = (nu, depth)
                    heapq.heappush(heap, (-nu, -depth, key))
            next_use.update(zip(keys, nexts))
        else:
            assert isinstance(step, _Insert)
            for i, key in enumerate(keys):
                if key in cached:
                    continue
                nu = next_use.get(key, _INF)
                if nu == _INF:
                    break
                # Useless unless the parent comes in again before this block's next use.
                # Past the first block the parent is always cached: it was cached or
                # admitted one step before, and nothing was evicted since.
                if (
                    i == 0
                    and step.parent is not None
                    and step.parent not in cached
                    and step.parent_next_insert > nu
                ):
                    break
                depth = a + i
                if len(cached) >= capacity_blocks and not _evict_for(heap, cached, nu, depth):
                    break
                cached[key] = (nu, depth)
                heapq.heappush(heap, (-nu, -depth, key))
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
