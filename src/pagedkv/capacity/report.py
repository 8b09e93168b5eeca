"""The capacity report of a plan, all frozen: per group, per worker and per context
length, and the plan as a whole (the one source of numbers the CLI and simulator print)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pagedkv.errors import PlanningError
from pagedkv.planning.sizing import RequestCost
from pagedkv.planning.types import KVCacheConfig

__all__ = [
    "GroupReport",
    "ConcurrencyPoint",
    "GroupingAlternative",
    "WorkerReport",
    "KVCachePlan",
]


@dataclass(frozen=True, kw_only=True)
class GroupReport:
    """One global KV cache group (all pipeline stages, one tensor-parallel rank).
    ``page_size_bytes``: what a block id costs it (its layers' padded pages);
    ``waste_bytes``: what such a block holds no KV in (empty slots plus padding)."""

    group_id: int
    kind: str
    role: str
    layer_names: tuple[str, ...]
    block_size: int
    page_size_bytes: int
    real_page_size_bytes: int
    padding_bytes: int
    unused_slot_bytes: int
    waste_bytes: int
    waste_fraction: float
    blocks_per_request: int
    host_resident: bool = False

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)


@dataclass(frozen=True, kw_only=True)
class ConcurrencyPoint:
    """Capacity for requests of ``context_len`` tokens (None: no device group holds
    them): usable blocks (no null block) / blocks per request, its floor, times the
    length; ``vllm_max_concurrency`` counts the null block as vLLM does."""

    context_len: int
    blocks_per_request: int = 0
    bytes_per_request: int = 0
    max_concurrency: float | None = None
    max_requests: int | None = None
    token_capacity: int | None = None
    vllm_max_concurrency: float | None = None


@dataclass(frozen=True, kw_only=True)
class GroupingAlternative:
    """One candidate grouping the planner scored (at ``reference_len`` tokens), with the
    group budget in force and whether it was within it."""

    name: str
    chosen: bool
    block_sizes: tuple[int, ...]
    num_groups: int
    layers_per_group: int
    bytes_per_block: int
    waste_fraction: float
    bytes_per_request: int
    reference_len: int
    description: str
    max_groups: int | None = None
    within_budget: bool = True


@dataclass(frozen=True, kw_only=True)
class WorkerReport:
    worker: int
    num_blocks: int
    bytes_per_block: int
    device_bytes: int
    host_bytes: int
    available_bytes: int
    num_layers: int


@dataclass(frozen=True, kw_only=True)
class KVCachePlan:
    """Everything planned for one engine: per-worker configs and the numbers to print
    (docs/planning.md, "Capacity"). ``max_concurrency`` starts at ``max_model_len``;
    ``largest_max_model_len`` is the longest request these blocks hold."""

    configs: tuple[KVCacheConfig, ...]
    workers: tuple[WorkerReport, ...]
    block_size: int
    num_blocks: int
    usable_blocks: int
    bytes_per_block: int
    total_bytes_per_block: int
    groups: tuple[GroupReport, ...]
    max_model_len: int
    max_model_len_auto_fitted: bool
    largest_max_model_len: int
    max_concurrency: tuple[ConcurrencyPoint, ...]
    token_capacity: int | None
    full_attention_token_capacity: int | None
    waste_bytes_per_request: int
    waste_fraction: float
    alternatives: tuple[GroupingAlternative, ...]
    kv_tp_replicas: int
    kv_cache_layout: str
    # Blocks one request holds at any length (capacity.concurrency_points reads it).
    request_cost: RequestCost | None = field(default=None, compare=False, repr=False)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def concurrency_at(self, context_len: int) -> ConcurrencyPoint:
        for point in self.max_concurrency:
            if point.context_len == context_len:
                return point
        planned = ", ".join(str(p.context_len) for p in self.max_concurrency)
        raise PlanningError(
            f"no concurrency point for context_len={context_len!r}: the plan has {planned}; "
            "pass it in plan_kv_cache(..., context_lengths=[...])"
        )

    def __rich_repr__(self) -> Iterator[tuple[str, Any]]:
        yield "num_blocks", self.num_blocks
        yield "block_size", self.block_size
        yield "bytes_per_block", self.bytes_per_block
        yield "groups", ", ".join(f"{g.kind} x{g.num_layers}" for g in self.groups)
        yield "max_model_len", self.max_model_len
        yield "token_capacity", self.token_capacity
        yield "waste_fraction", round(self.waste_fraction, 4)
        for p in self.max_concurrency:
            yield f"max_concurrency at {p.context_len:,}", p.max_concurrency

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{k}</th>"
            f"<td style='text-align:right;white-space:nowrap'>{_rounded(k, v)}</td></tr>"
            for k, v in self.__rich_repr__()
        )
        return f"<table><caption>KV cache plan</caption>{rows}</table>"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (the per-worker configs are summed up in ``workers``)."""
        out = asdict(replace(self, configs=(), request_cost=None))
        del out["configs"], out["request_cost"]
        for group, report in zip(out["groups"], self.groups):
            group["num_layers"] = report.num_layers
        return {**out, "num_groups": self.num_groups}


def _rounded(label: str, value: Any) -> str:
    """A figure as a notebook shows it: thousands separated, fractions as percentages,
    concurrency as ``3.46x``."""
    if isinstance(value, float) and "fraction" in label:
        return f"{value:.2%}"
    if isinstance(value, float) and "concurrency" in label:
        return f"{value:,.2f}x"
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)
