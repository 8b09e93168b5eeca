"""What a fleet run measured: per replica and overall."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ReplicaStats",
    "FleetResult",
]


@dataclass(frozen=True, kw_only=True)
class ReplicaStats:
    """One replica's share of a fleet run."""

    requests: int
    prompt_tokens: int
    hit_tokens: int
    preemptions: int
    steps: int
    mean_running: float  # time-averaged running requests over the fleet's makespan
    mean_queue_delay_steps: float  # steps a request waited between arrival and admission

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True, kw_only=True)
class FleetResult:
    """A fleet run: per replica and overall; ``bound_*``: one cache N times the size."""

    router: str
    num_replicas: int
    num_blocks_per_replica: int
    trace: str
    requests: int
    replicas: tuple[ReplicaStats, ...]
    max_queue_delay_steps: int
    makespan_s: float
    wall_seconds: float
    index_entries: int | None = None
    single_cache_hit_rate: float | None = None  # LRU on one N-times cache
    bound_hit_rate: float | None = None  # clairvoyant bound of that cache
    router_options: dict[str, Any] = field(default_factory=dict)
    event_delay_s: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.replicas)

    @property
    def hit_rate(self) -> float:
        total = self.prompt_tokens
        return sum(r.hit_tokens for r in self.replicas) / total if total else 0.0

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.replicas)

    @property
    def imbalance(self) -> float:
        """max / mean of the replicas' time-averaged running requests (1.0: even)."""
        running = [r.mean_running for r in self.replicas]
        mean = sum(running) / len(running)
        return max(running) / mean if mean else 1.0

    @property
    def mean_queue_delay_steps(self) -> float:
        total = sum(r.requests for r in self.replicas)
        weighted = sum(r.mean_queue_delay_steps * r.requests for r in self.replicas)
        return weighted / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["replicas"] = [
            dataclasses.asdict(r) | {"hit_rate": round(r.hit_rate, 6)} for r in self.replicas
        ]
        data.update(
            hit_rate=round(self.hit_rate, 6),
            preemptions=self.preemptions,
            imbalance=round(self.imbalance, 4),
            mean_queue_delay_steps=round(self.mean_queue_delay_steps, 3),
            prompt_tokens=self.prompt_tokens,
        )
        return data
