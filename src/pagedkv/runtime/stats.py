"""Prefix-cache statistics: lookups (queries, in tokens) and hits, per step and in total."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "PrefixCacheStats",
    "PrefixCacheStatsCounter",
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


class PrefixCacheStatsCounter:
    """Lookups and hits since construction and since the previous ``take_step``."""

    def __init__(self) -> None:
        self._total = [0] * 6  # requests, queries, hits; then the same after preemption
        self._step = [0] * 6
        self._reset = [False, False]  # total, step
        self._evictions_at_step = 0

    def record(self, num_tokens: int, num_hit_tokens: int, preempted: bool) -> None:
        i = 3 if preempted else 0
        for counts in (self._total, self._step):
            counts[i] += 1
            counts[i + 1] += num_tokens
            counts[i + 2] += num_hit_tokens

    def mark_reset(self) -> None:
        self._reset = [True, True]

    def total(self, evictions: int) -> PrefixCacheStats:
        return _snapshot(self._total, self._reset[0], evictions)

    def take_step(self, evictions: int) -> PrefixCacheStats:
        """The step's counts (``evictions``: the running total), then start afresh."""
        step = evictions - self._evictions_at_step
        stats = _snapshot(self._step, self._reset[1], step)
        self._step, self._reset[1], self._evictions_at_step = [0] * 6, False, evictions
        return stats


def _snapshot(c: list[int], reset: bool, evictions: int) -> PrefixCacheStats:
    return PrefixCacheStats(c[0], c[1], c[2], c[3], c[4], c[5], reset, evictions)
