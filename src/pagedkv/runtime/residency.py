"""Block residency metrics: how long sampled blocks live, idle and get reused before
eviction (vLLM 0.33's ``kv_cache_metrics``). Times come from ``time.monotonic_ns``."""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

__all__ = ["BlockMetricsState", "BlockResidency", "KVCacheMetricsCollector"]

# Accesses kept per block (the last few: reuse gaps need at least two).
ACCESS_HISTORY_LEN = 4


class _HasBlockId(Protocol):
    block_id: int


@dataclass(frozen=True)
class BlockResidency:
    """One sampled block's residency, measured when it was evicted."""

    lifetime_seconds: float
    idle_seconds: float
    reuse_gaps_seconds: tuple[float, ...]


class BlockMetricsState:
    """Birth time, last access and the last few access times of one block."""

    def __init__(self) -> None:
        now_ns = time.monotonic_ns()
        self.birth_time_ns = now_ns
        self.last_access_ns = now_ns
        self.access_history: deque[int] = deque(maxlen=ACCESS_HISTORY_LEN)

    def record_access(self) -> None:
        now_ns = time.monotonic_ns()
        self.last_access_ns = now_ns
        self.access_history.append(now_ns)

    def get_lifetime_seconds(self) -> float:
        return (time.monotonic_ns() - self.birth_time_ns) / 1e9

    def get_idle_time_seconds(self) -> float:
        return (time.monotonic_ns() - self.last_access_ns) / 1e9

    def get_reuse_gaps_seconds(self) -> list[float]:
        times = list(self.access_history)
        return [(later - earlier) / 1e9 for earlier, later in itertools.pairwise(times)]


class KVCacheMetricsCollector:
    """Samples a fraction ``sample_rate`` of allocated blocks and records their residency
    when they are evicted; ``drain_events`` hands the records over."""

    def __init__(self, sample_rate: float = 0.01) -> None:
        if not 0 < sample_rate <= 1.0:
            raise AssertionError(f"sample_rate must be in (0, 1.0], got {sample_rate}")
        self.sample_rate = sample_rate
        self.block_metrics: dict[int, BlockMetricsState] = {}
        self._eviction_events: list[BlockResidency] = []

    def should_sample_block(self) -> bool:
        return random.random() < self.sample_rate

    def on_block_allocated(self, block: _HasBlockId) -> None:
        if self.should_sample_block():
            self.block_metrics[block.block_id] = BlockMetricsState()

    def on_block_accessed(self, block: _HasBlockId) -> None:
        state = self.block_metrics.get(block.block_id)
        if state is not None:
            state.record_access()

    def on_block_evicted(self, block: _HasBlockId) -> None:
        state = self.block_metrics.pop(block.block_id, None)
        if state is None:
            return
        self._eviction_events.append(
            BlockResidency(
                lifetime_seconds=state.get_lifetime_seconds(),
                idle_seconds=state.get_idle_time_seconds(),
                reuse_gaps_seconds=tuple(state.get_reuse_gaps_seconds()),
            )
        )

    def reset(self) -> None:
        self.block_metrics.clear()
        self._eviction_events.clear()

    def drain_events(self) -> list[BlockResidency]:
        events, self._eviction_events = self._eviction_events, []
        return events
