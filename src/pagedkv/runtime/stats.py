"""Prefix-cache statistics: lookups (queries, in tokens) and hits, per step and in total."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "PrefixCacheStats",
    "stats_from_counts",
]


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
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def stats_from_counts(counts: list[int], reset: bool, evictions: int) -> PrefixCacheStats:
    """``counts``: requests, queries, hits, then the same for re-admissions."""
    return PrefixCacheStats(
        counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], reset, evictions
    )
