"""plan_kv_cache: the planner's configs plus every number the CLI and simulator print."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pagedkv.config import EngineConfig
from pagedkv.errors import PlanningError
from pagedkv.planning.capacity import (
    concurrency_point,
    full_attention_token_capacity,
    group_reports,
    request_waste,
    scheduler_block_size,
)
from pagedkv.planning.placement import resolve_kv_cache_layout
from pagedkv.planning.planner import WorkerPlan, plan_workers
from pagedkv.planning.report import KVCachePlan, WorkerReport
from pagedkv.specs.base import KVCacheSpec


def _lengths(max_model_len: int, context_lengths: Iterable[int] | None) -> list[int]:
    extra = []
    for length in context_lengths or ():
        if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
            raise PlanningError(f"context_lengths must be positive integers, got {length!r}")
        if length != max_model_len and length not in extra:
            extra.append(length)
    return [max_model_len, *sorted(extra)]


def _workers(plan: WorkerPlan, available: Sequence[int]) -> tuple[WorkerReport, ...]:
    return tuple(
        WorkerReport(
            worker=w,
            num_blocks=c.num_blocks,
            bytes_per_block=plan.bytes_per_block[w],
            device_bytes=sum({t.size for t in c.device_tensors}),
            host_bytes=sum({t.size for t in c.host_tensors}),
            available_bytes=available[w],
            num_layers=len(c.layer_names),
        )
        for w, c in enumerate(plan.configs)
    )


def plan_kv_cache(
    config: EngineConfig,
    kv_cache_specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
    available_memory_per_worker: Sequence[int],
    *,
    context_lengths: Iterable[int] | None = None,
    max_model_len_limit: int | None = None,
) -> KVCachePlan:
    """Plan every worker's KV cache and report capacity, waste and the alternatives.

    ``context_lengths`` adds concurrency points besides ``max_model_len``.
    """
    plan = plan_workers(
        config,
        kv_cache_specs_per_worker,
        available_memory_per_worker,
        max_model_len_limit=max_model_len_limit,
    )
    length = plan.max_model_len
    num_blocks = plan.configs[0].num_blocks
    cost = plan.cost
    bpb = max(plan.bytes_per_block)
    reports = group_reports(plan.groups, cost, length)
    points = tuple(
        concurrency_point(cost, n, num_blocks, bpb) for n in _lengths(length, context_lengths)
    )
    waste_bytes, waste_fraction = request_waste(reports)
    return KVCachePlan(
        configs=plan.configs,
        workers=_workers(plan, available_memory_per_worker),
        block_size=scheduler_block_size(plan.groups, config.block_size),
        num_blocks=num_blocks,
        usable_blocks=num_blocks - 1,
        bytes_per_block=bpb,
        total_bytes_per_block=sum(plan.bytes_per_block),
        groups=tuple(reports),
        max_model_len=length,
        max_model_len_auto_fitted=plan.auto_fitted,
        max_concurrency=points,
        token_capacity=points[0].token_capacity,
        full_attention_token_capacity=full_attention_token_capacity(plan.groups, num_blocks),
        waste_bytes_per_request=waste_bytes,
        waste_fraction=waste_fraction,
        alternatives=plan.alternatives,
        kv_tp_replicas=plan.configs[0].kv_tp_replicas,
        kv_cache_layout=plan.configs[0].kv_cache_layout or resolve_kv_cache_layout(config),
    )
