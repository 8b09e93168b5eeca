"""Simulation results and the optional per-step time series."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from pagedkv.errors import ConfigError

__all__ = [
    "STEP_COLUMNS",
    "SimResult",
    "StepWriter",
]

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
    # One tuple per scheduler step (STEP_COLUMNS), kept with simulate(keep_steps=True).
    step_rows: tuple[tuple[float, ...], ...] | None = field(default=None, repr=False, compare=False)
    retention: str | None = None  # the manager's retention policy, if it has one
    # Part of hit_tokens served by the host tier (loaded, not recomputed).
    host_hit_tokens: int = 0
    # Bound of one cache holding device and host capacity together (with a host tier).
    tiered_bound_hit_tokens: int | None = None
    # Requests of the whole trace source (more than ``requests`` when a limit cut it).
    trace_requests: int | None = None

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

    def summary_rows(self) -> list[tuple[str, str]]:
        """(what, value) pairs as ``pagedkv simulate`` prints them."""
        speed = self.manager_calls / self.manager_seconds if self.manager_seconds else 0
        rows = [
            ("KV cache blocks", f"{self.num_blocks:,} x {self.block_size} tokens"),
            *([("prefix-cache retention", self.retention)] if self.retention else []),
            ("requests (done / replayed)", f"{self.requests_done:,} / {self.requests:,}"),
            ("replayed of the trace", self._replayed_share()),
            ("rejected (prompt >= max_model_len)", f"{self.requests_rejected_too_long:,}"),
            ("unservable (cache too small)", f"{self.requests_unservable:,}"),
            ("prompt tokens", f"{self.prompt_tokens:,}"),
            ("prefix-cache hit tokens", f"{self.hit_tokens:,}"),
            ("hit rate (tokens)", f"{100 * self.hit_rate:.2f} %"),
            ("hit rate (requests with a hit)", f"{100 * self.request_hit_rate:.2f} %"),
        ]
        if self.bound_hit_rate is not None:
            rows.append(("best possible hit rate (bound)", f"{100 * self.bound_hit_rate:.2f} %"))
        rows.append(("preemptions", f"{self.preemptions:,}"))
        if self.evictions is not None:
            rows.append(("evictions", f"{self.evictions:,}"))
        rate = f"{speed:,.0f} calls/s" if speed else "no calls"
        return [
            *rows,
            ("block usage peak / mean", f"{self.peak_usage:.1%} / {self.mean_usage:.1%}"),
            ("steps", f"{self.steps:,}"),
            ("manager calls", f"{self.manager_calls:,}"),
            ("manager time", f"{self.manager_seconds:.2f} s ({rate})"),
            ("wall time", f"{self.wall_seconds:.2f} s"),
        ]

    def _replayed_share(self) -> str:
        total = self.requests if self.trace_requests is None else self.trace_requests
        if total == self.requests:
            return f"all {total:,} requests"
        return f"{self.requests:,} of {total:,} requests"

    def to_dataframe(self) -> Any:
        """The per-step series as a pandas DataFrame (``STEP_COLUMNS``; needs pandas and
        a result from ``simulate(..., keep_steps=True)``)."""
        from pagedkv.sim.reports.frames import dataframe

        if self.step_rows is None:
            raise ConfigError(
                "this result kept no per-step series: replay with simulate(..., keep_steps=True)"
            )
        return dataframe(self.step_rows, STEP_COLUMNS)

    def __rich_repr__(self) -> Iterator[tuple[str, Any]]:
        yield "model", self.model
        yield "trace", self.trace
        yield "num_blocks", self.num_blocks
        yield "requests_done", self.requests_done
        yield "hit_rate", round(self.hit_rate, 4)
        if self.bound_hit_rate is not None:
            yield "bound_hit_rate", round(self.bound_hit_rate, 4)
        yield "preemptions", self.preemptions

    def _repr_html_(self) -> str:
        from pagedkv.sim.reports.frames import html_table

        return html_table(f"{self.model} on {self.trace}", self.summary_rows())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, derived rates included (the step series left out)."""
        data = asdict(self)
        data.pop("step_rows")
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
