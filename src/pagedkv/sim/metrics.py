"""Simulation results and the optional per-step time series."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

STEP_COLUMNS = (
    "step",
    "time_s",
    "running",
    "waiting",
    "scheduled_tokens",
    "used_blocks",
    "preemptions",
    "hit_tokens",
)


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """What one replay measured. Hit counts cover first admissions only (as vLLM's
    prefix-cache metric does); re-admissions after preemption are counted apart."""

    model: str
    trace: str
    num_blocks: int
    block_size: int
    kv_cache_groups: tuple[str, ...]
    requests: int
    requests_done: int
    requests_rejected_too_long: int
    requests_unservable: int
    prompt_tokens: int
    hit_tokens: int
    hit_requests: int
    admitted_requests: int
    readmission_tokens: int
    readmission_hit_tokens: int
    preemptions: int
    evictions: int | None
    peak_used_blocks: int
    mean_used_blocks: float
    peak_running: int
    steps: int
    computed_tokens: int
    manager_calls: int
    manager_calls_by_kind: dict[str, int]
    allocate_slots_failed: int
    manager_seconds: float
    request_seconds: float
    wall_seconds: float
    settings: dict[str, Any] = field(default_factory=dict)
    bound_hit_tokens: int | None = None
    # Part of hit_tokens served by the host tier (loaded, not recomputed).
    host_hit_tokens: int = 0
    # Bound of one cache holding device and host capacity together (with a host tier).
    tiered_bound_hit_tokens: int | None = None

    @property
    def usable_blocks(self) -> int:
        return max(self.num_blocks - 1, 1)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hit_requests / self.admitted_requests if self.admitted_requests else 0.0

    @property
    def peak_usage(self) -> float:
        return self.peak_used_blocks / self.usable_blocks

    @property
    def mean_usage(self) -> float:
        return self.mean_used_blocks / self.usable_blocks

    @property
    def bound_hit_rate(self) -> float | None:
        if self.bound_hit_tokens is None:
            return None
        return self.bound_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def overhead_seconds(self) -> float:
        """Loop time outside manager calls and request building/hashing."""
        return max(self.wall_seconds - self.manager_seconds - self.request_seconds, 0.0)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, derived rates included."""
        data = asdict(self)
        data.update(
            hit_rate=round(self.hit_rate, 6),
            request_hit_rate=round(self.request_hit_rate, 6),
            peak_usage=round(self.peak_usage, 6),
            mean_usage=round(self.mean_usage, 6),
            overhead_seconds=round(self.overhead_seconds, 4),
            manager_calls_per_second=(
                round(self.manager_calls / self.manager_seconds, 1)
                if self.manager_seconds
                else None
            ),
        )
        if self.bound_hit_tokens is not None:
            data["bound_hit_rate"] = round(self.bound_hit_rate or 0.0, 6)
        if self.prompt_tokens:
            data["host_hit_rate"] = round(self.host_hit_tokens / self.prompt_tokens, 6)
            if self.tiered_bound_hit_tokens is not None:
                data["tiered_bound_hit_rate"] = round(
                    self.tiered_bound_hit_tokens / self.prompt_tokens, 6
                )
        for key in ("manager_seconds", "request_seconds", "wall_seconds", "mean_used_blocks"):
            data[key] = round(data[key], 4)
        return data


class StepWriter:
    """Writes one CSV row per scheduler step (see ``STEP_COLUMNS``)."""

    def __init__(self, path: str | Path) -> None:
        self._file: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._file.write(",".join(STEP_COLUMNS) + "\n")

    def write(self, *row: float) -> None:
        self._file.write(",".join(map(str, row)) + "\n")

    def close(self) -> None:
        self._file.close()
