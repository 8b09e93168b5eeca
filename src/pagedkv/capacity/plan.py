"""The capacity report: one planning pass of the core planner, then what its blocks hold
(requests and tokens per context length, padding waste per group, the alternatives a
grouping rule scored and the largest ``max_model_len`` the blocks hold)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from pagedkv.capacity.report import ConcurrencyPoint, GroupReport, KVCachePlan, WorkerReport
from pagedkv.config import EngineConfig, check_int
from pagedkv.errors import PlanningError
from pagedkv.planning.layout import is_block_outermost, resolve_kv_cache_layout
from pagedkv.planning.placement import bytes_per_block, group_width_bytes
from pagedkv.planning.planner import plan_kv_cache_configs
from pagedkv.planning.sizing import RequestCost
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs.base import KVCacheSpec
from pagedkv.specs.full import FullAttentionSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "plan_kv_cache",
    "concurrency_points",
    "inner_specs",
    "is_full_attention",
    "scheduler_block_size",
    "group_reports",
    "RequestWaste",
    "request_waste",
    "concurrency_point",
    "full_attention_token_capacity",
]


def plan_kv_cache(
    config: EngineConfig,
    kv_cache_specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
    available_memory_per_worker: Sequence[int],
    *,
    context_lengths: Iterable[int] | None = None,
    max_model_len_limit: int | None = None,
) -> KVCachePlan:
    """Plan every worker's KV cache in one pass (the flow in docs/planning.md) and report
    capacity, waste, the alternatives and the largest ``max_model_len`` the blocks hold
    (``-1`` fits it, at most ``max_model_len_limit``). ``context_lengths`` adds
    concurrency points besides ``max_model_len``.

    Args:
        config: the engine config (``max_model_len=-1`` fits the length).
        kv_cache_specs_per_worker: each worker's layer name -> KV cache spec.
        available_memory_per_worker: bytes each worker can give the KV cache.
        context_lengths: extra context lengths in tokens for the concurrency table (None: the
            defaults below ``max_model_len``).
        max_model_len_limit: the most tokens an auto-fitted ``max_model_len`` may take (None: the
            planner's default).
    """
    if max_model_len_limit is not None:  # named here: the caller called plan_kv_cache
        check_int("plan_kv_cache", "max_model_len_limit", max_model_len_limit, error=PlanningError)
    planned = plan_kv_cache_configs(
        config,
        kv_cache_specs_per_worker,
        available_memory_per_worker,
        max_model_len_limit=max_model_len_limit,
    )
    groups, cost, length = planned.groups, planned.cost, planned.max_model_len
    num_blocks, bpb = planned.num_blocks, planned.bytes_per_block
    reports = group_reports(groups, cost, length)
    points = [
        concurrency_point(cost, n, num_blocks, max(bpb))
        for n in _lengths("plan_kv_cache", length, context_lengths)
    ]
    waste_bytes, waste_fraction = request_waste(reports)
    available = available_memory_per_worker
    workers = (
        WorkerReport(
            worker=w,
            num_blocks=c.num_blocks,
            bytes_per_block=bpb[w],
            device_bytes=sum({t.size for t in c.device_tensors}),
            host_bytes=sum({t.size for t in c.host_tensors}),
            available_bytes=available[w],
            num_layers=len(c.layer_names),
        )
        for w, c in enumerate(planned.configs)
    )
    fitted = planned.max_model_len_auto_fitted
    limit = max(planned.max_model_len_limit, length)
    largest = length if fitted else cost.largest_fitting(num_blocks - 1, limit)
    return KVCachePlan(
        configs=planned.configs,
        workers=tuple(workers),
        block_size=scheduler_block_size(groups, config.block_size),
        num_blocks=num_blocks,
        usable_blocks=num_blocks - 1,
        bytes_per_block=max(bpb),
        total_bytes_per_block=sum(bpb),
        groups=tuple(reports),
        max_model_len=length,
        max_model_len_auto_fitted=fitted,
        largest_max_model_len=largest,
        max_concurrency=tuple(points),
        token_capacity=points[0].token_capacity,
        full_attention_token_capacity=full_attention_token_capacity(groups, num_blocks),
        waste_bytes_per_request=waste_bytes,
        waste_fraction=waste_fraction,
        alternatives=planned.alternatives,
        kv_tp_replicas=planned.kv_tp_replicas,
        kv_cache_layout=planned.configs[0].kv_cache_layout or resolve_kv_cache_layout(config),
        request_cost=cost,
    )


def concurrency_points(plan: KVCachePlan, lengths: Iterable[int]) -> list[ConcurrencyPoint]:
    """Capacity at any context lengths from the plan's own pass (no planning again)."""
    if plan.request_cost is None:
        raise PlanningError("this KVCachePlan has no request cost: build it with plan_kv_cache")
    return [
        concurrency_point(plan.request_cost, n, plan.num_blocks, plan.bytes_per_block)
        for n in _lengths("concurrency_points", plan.max_model_len, lengths)
    ]


def _lengths(caller: str, max_model_len: int, context_lengths: Iterable[int] | None) -> list[int]:
    extra = []
    for length in context_lengths or ():
        check_int(caller, "context_lengths", length, error=PlanningError)
        if length != max_model_len and length not in extra:
            extra.append(length)
    return [max_model_len, *sorted(extra)]


def inner_specs(spec: KVCacheSpec) -> list[KVCacheSpec]:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return list(spec.kv_cache_specs.values())
    return [spec]


def is_full_attention(spec: KVCacheSpec) -> bool:
    return all(isinstance(s, FullAttentionSpec) for s in inner_specs(spec))


def scheduler_block_size(groups: Sequence[KVCacheGroupSpec], default: int) -> int:
    """Smallest block size among prefix-cacheable groups (all groups if none are)."""
    specs = [g.kv_cache_spec for g in groups if g.layer_names]
    cacheable = [s.block_size for s in specs if s.prefix_cacheable]
    return min(cacheable or [s.block_size for s in specs], default=default)


def group_reports(
    groups: Sequence[KVCacheGroupSpec], cost: RequestCost, length: int
) -> list[GroupReport]:
    config = cost.config_at(length)
    block_outer = is_block_outermost(resolve_kv_cache_layout(config))
    device_bpb = bytes_per_block(groups, block_outer=block_outer)
    host_bpb = bytes_per_block(groups, host=True)
    reports = []
    for gid, group in enumerate(groups):
        spec = group.kv_cache_spec
        bpb = host_bpb if group.host_resident else device_bpb
        width, real = group_width_bytes(group), spec.real_page_size_bytes
        if not isinstance(spec, UniformTypeKVCacheSpecs):
            real *= len(group.layer_names)
        kinds = {s.kind for s in inner_specs(spec)}
        reports.append(
            GroupReport(
                group_id=gid,
                kind=kinds.pop() if len(kinds) == 1 else spec.kind,
                role=group.role,
                layer_names=group.layer_names,
                block_size=spec.block_size,
                page_size_bytes=width,
                real_page_size_bytes=real,
                padding_bytes=width - real,
                unused_slot_bytes=bpb - width,
                waste_bytes=bpb - real,
                waste_fraction=(bpb - real) / bpb if bpb else 0.0,
                blocks_per_request=spec.max_memory_usage_blocks(config),
                host_resident=group.host_resident,
            )
        )
    return reports


class RequestWaste(NamedTuple):
    """The padding a max-length request holds on the device."""

    waste_bytes: int  # per worker slot
    waste_fraction: float  # of the bytes the request holds


def request_waste(reports: Sequence[GroupReport]) -> RequestWaste:
    """Padding bytes a max-length request holds (per worker slot) and their share."""
    device = [r for r in reports if not r.host_resident]
    waste = sum(r.blocks_per_request * r.waste_bytes for r in device)
    total = sum(r.blocks_per_request * (r.waste_bytes + r.real_page_size_bytes) for r in device)
    return RequestWaste(waste, waste / total if total else 0.0)


def concurrency_point(
    cost: RequestCost, length: int, num_blocks: int, bytes_per_block: int
) -> ConcurrencyPoint:
    """Requests of ``length`` tokens that ``num_blocks`` blocks (one the null block) hold.

    Args:
        cost: blocks one request holds at a given length, summed over device groups.
        length: the context length of each request, in tokens.
        num_blocks: KV cache blocks per worker, the null block included.
        bytes_per_block: bytes of one block across all groups on the largest worker.
    """
    blocks = cost.blocks(length)
    if blocks == 0:
        return ConcurrencyPoint(context_len=length)
    usable = num_blocks - 1
    return ConcurrencyPoint(
        context_len=length,
        blocks_per_request=blocks,
        bytes_per_request=blocks * bytes_per_block,
        max_concurrency=usable / blocks,
        max_requests=usable // blocks,
        token_capacity=usable * length // blocks,
        vllm_max_concurrency=num_blocks / blocks,
    )


def full_attention_token_capacity(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int
) -> int | None:
    """Tokens the usable blocks hold if all go to full-attention groups (None: no such group)."""
    sizes = [
        g.kv_cache_spec.block_size
        for g in groups
        if g.layer_names and not g.host_resident and is_full_attention(g.kv_cache_spec)
    ]
    if not sizes:
        return None
    return int((num_blocks - 1) / sum(1 / bs for bs in sizes))
