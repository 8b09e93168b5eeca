"""Prefix-cache statistics: lookups (queries, in tokens) and hits, per step and in total."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixCacheStats:
    """Counts over a period. Re-admissions after preemption are counted apart."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False
    # Cached blocks evicted (hash dropped to reuse the block, or by evict_blocks).
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class PrefixCacheStatsCounter:
    """Mutable counters behind ``KVCacheManager.prefix_cache_stats``."""

    __slots__ = (
        "hits",
        "preempted_hits",
        "preempted_queries",
        "preempted_requests",
        "queries",
        "requests",
        "reset",
    )

    def __init__(self) -> None:
        self.requests = self.queries = self.hits = 0
        self.preempted_requests = self.preempted_queries = self.preempted_hits = 0
        self.reset = False

    def record(self, num_tokens: int, num_hit_tokens: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hit_tokens
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hit_tokens

    def snapshot(self, evictions: int = 0) -> PrefixCacheStats:
        return PrefixCacheStats(
            self.requests,
            self.queries,
            self.hits,
            self.preempted_requests,
            self.preempted_queries,
            self.preempted_hits,
            self.reset,
            evictions,
        )
