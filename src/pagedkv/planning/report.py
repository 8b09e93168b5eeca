"""The plan report: the one source of capacity numbers the CLI and simulator print."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from pagedkv.errors import PlanningError
from pagedkv.planning.types import KVCacheConfig


@dataclass(frozen=True, kw_only=True)
class GroupReport:
    """One global KV cache group (all pipeline stages, one tensor-parallel rank).

    ``page_size_bytes`` is what one block id costs the group (the sum of its layers'
    padded pages); ``waste_bytes`` is what such a block holds no KV in: empty layer
    slots (``bytes_per_block - page_size_bytes``) plus page padding.
    """

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
    """Capacity for requests of ``context_len`` tokens.

    ``max_concurrency`` = usable blocks (null block excluded) / blocks one request
    needs; ``max_requests`` is its floor; ``token_capacity`` = ``max_concurrency *
    context_len`` rounded down; ``vllm_max_concurrency`` counts the null block as vLLM does.
    """

    context_len: int
    blocks_per_request: int
    bytes_per_request: int
    max_concurrency: float | None
    max_requests: int | None
    token_capacity: int | None
    vllm_max_concurrency: float | None


@dataclass(frozen=True, kw_only=True)
class GroupingAlternative:
    """One candidate grouping the planner scored (at ``reference_len`` tokens).

    ``max_groups`` is the group budget in force (``CacheConfig.max_kv_cache_groups``
    or the planner's default); ``within_budget`` is False for a grouping the budget
    excluded however little it wastes.
    """

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
    """Everything planned for one engine: per-worker configs plus the numbers to print.

    ``block_size`` is the scheduler block size (smallest block size of the
    prefix-cacheable groups, else of all groups). ``bytes_per_block`` is the largest
    per-worker device cost of one block id; ``total_bytes_per_block`` sums workers.
    ``waste_fraction`` is the share of a ``max_model_len`` request's memory that is
    padding. ``max_concurrency`` lists one point per context length, ``max_model_len``
    first.
    """

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
    max_concurrency: tuple[ConcurrencyPoint, ...]
    token_capacity: int | None
    full_attention_token_capacity: int | None
    waste_bytes_per_request: int
    waste_fraction: float
    alternatives: tuple[GroupingAlternative, ...]
    kv_tp_replicas: int
    kv_cache_layout: str

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

    def _repr_html_(self) -> str:
        from html import escape

        rows = "".join(
            f"<tr><th style='text-align:left'>{escape(k)}</th><td>{escape(str(v))}</td></tr>"
            for k, v in self.__rich_repr__()
        )
        points = "".join(
            f"<tr><td>{p.context_len:,}</td><td>{p.blocks_per_request:,}</td>"
            f"<td>{'-' if p.max_concurrency is None else f'{p.max_concurrency:.2f}x'}</td></tr>"
            for p in self.max_concurrency
        )
        return (
            f"<table><caption>KV cache plan</caption>{rows}</table><table><tr><th>context"
            f"</th><th>blocks/request</th><th>max concurrency</th></tr>{points}</table>"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (configs summarised per worker)."""
        out: dict[str, Any] = {
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "usable_blocks": self.usable_blocks,
            "bytes_per_block": self.bytes_per_block,
            "total_bytes_per_block": self.total_bytes_per_block,
            "max_model_len": self.max_model_len,
            "max_model_len_auto_fitted": self.max_model_len_auto_fitted,
            "token_capacity": self.token_capacity,
            "full_attention_token_capacity": self.full_attention_token_capacity,
            "waste_bytes_per_request": self.waste_bytes_per_request,
            "waste_fraction": self.waste_fraction,
            "kv_tp_replicas": self.kv_tp_replicas,
            "kv_cache_layout": self.kv_cache_layout,
            "num_groups": self.num_groups,
        }
        out["groups"] = [{**_plain(asdict(g)), "num_layers": g.num_layers} for g in self.groups]
        out["max_concurrency"] = [_plain(asdict(p)) for p in self.max_concurrency]
        out["alternatives"] = [_plain(asdict(a)) for a in self.alternatives]
        out["workers"] = [_plain(asdict(w)) for w in self.workers]
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
