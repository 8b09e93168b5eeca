"""The cross-worker planner: specs and free memory per worker to one config each, the
checks it runs on any builder's output, and the plan report (``plan_kv_cache``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from pagedkv.config import EngineConfig, check_int
from pagedkv.errors import InsufficientMemoryError, PlanningError
from pagedkv.planning import sizing
from pagedkv.planning.builder import (
    DefaultKVCacheConfigBuilder,
    KVCacheConfigBuilder,
    get_kv_cache_config_builder,
)
from pagedkv.planning.grouping import check_exact_partition, with_retained_tokens
from pagedkv.planning.placement import check_regions, resolve_kv_cache_layout
from pagedkv.planning.types import (
    GroupingAlternative,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCachePlan,
    WorkerReport,
)
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs.base import KVCacheSpec

# Upper bound for max_model_len=-1 when nothing else bounds it (local-only models).
DEFAULT_MAX_MODEL_LEN_LIMIT = 1 << 24

Groups = tuple[KVCacheGroupSpec, ...]


def _check_inputs(specs: Sequence[Mapping[str, KVCacheSpec]], available: Sequence[int]) -> None:
    if not specs:
        raise PlanningError("kv_cache_specs_per_worker is empty: at least one worker is needed")
    if len(specs) != len(available):
        raise PlanningError(
            f"kv_cache_specs_per_worker has {len(specs)} workers but "
            f"available_memory_per_worker has {len(available)}"
        )
    for w, value in enumerate(available):
        if not isinstance(value, int) or isinstance(value, bool):
            raise PlanningError(
                f"available_memory_per_worker[{w}] must be an integer number of bytes, "
                f"got {value!r}"
            )


def _group(
    builder: KVCacheConfigBuilder, config: EngineConfig, specs: Mapping[str, KVCacheSpec]
) -> tuple[Groups, tuple[GroupingAlternative, ...]]:
    # The default builder's own grouping also reports the alternatives its rule scored.
    if (
        isinstance(builder, DefaultKVCacheConfigBuilder)
        and type(builder).get_kv_cache_groups is DefaultKVCacheConfigBuilder.get_kv_cache_groups
        and config.model.kv_cache_grouping is None
    ):
        groups, alternatives = builder.choose_kv_cache_groups(config, specs)
    else:
        groups, alternatives = tuple(builder.get_kv_cache_groups(config, specs)), ()
    for i, group in enumerate(groups):
        if not isinstance(group, KVCacheGroupSpec):
            raise PlanningError(
                f"{type(builder).__qualname__}.get_kv_cache_groups returned {group!r} at "
                f"index {i}, not a KVCacheGroupSpec"
            )
    check_exact_partition(groups, specs, source=type(builder).__qualname__)
    return groups, alternatives


def pool_bytes_per_block(
    builder: KVCacheConfigBuilder, config: EngineConfig, groups: Sequence[KVCacheGroupSpec]
) -> int:
    """Device bytes one block id costs on a worker: the builder's answer, else a probe."""
    if not any(g.layer_names and not g.host_resident for g in groups):
        return 0
    name = type(builder).__qualname__
    value = builder._get_pool_bytes_per_block(config, groups)
    if value is None:
        probe = builder.get_kv_cache_config_from_groups(config, groups, 1)
        sizes = sorted({t.size for t in probe.device_tensors})
        if len(sizes) > 1:
            raise PlanningError(
                f"{name}: KV cache tensors must share one device backing allocation, got "
                f"sizes {sizes}; override _get_pool_bytes_per_block for several allocations"
            )
        value = sizes[0] if sizes else 0
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise PlanningError(f"{name}: bytes per block must be a positive integer, got {value!r}")
    return value


def validate_worker_config(
    config: KVCacheConfig,
    groups: Sequence[KVCacheGroupSpec],
    num_blocks: int,
    available: int,
    worker: int,
    builder: KVCacheConfigBuilder,
) -> None:
    """Raise PlanningError (InsufficientMemoryError for memory) if a builder broke a rule."""
    name = type(builder).__qualname__
    if not isinstance(config, KVCacheConfig):
        raise PlanningError(f"{name} returned {config!r} for worker {worker}, not a KVCacheConfig")
    if config.num_blocks != num_blocks:
        raise PlanningError(
            f"{name} planned {config.num_blocks} blocks for worker {worker}, asked for {num_blocks}"
        )
    layers = [n for g in groups for n in g.layer_names]
    check_exact_partition(config.kv_cache_groups, layers, source=f"{name} (worker {worker})")
    sizes = {t.size for t in config.device_tensors}
    own_hook = (
        type(builder)._get_pool_bytes_per_block
        is not KVCacheConfigBuilder._get_pool_bytes_per_block
    )
    if len(sizes) > 1 and not own_hook:
        raise PlanningError(
            f"{name} placed worker {worker}'s device tensors in allocations of different "
            f"sizes {sorted(sizes)}; they must share one"
        )
    if sum(sizes) > available:
        raise InsufficientMemoryError(
            f"{name} placed {sum(sizes)} bytes of device tensors on worker {worker}, "
            f"which has {available} bytes available"
        )
    check_regions(config, worker)


def _size(
    builder: KVCacheConfigBuilder,
    config: EngineConfig,
    groups: Groups,
    specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
    available: Sequence[int],
    limit: int,
) -> tuple[list[list[KVCacheGroupSpec]], list[int], int, sizing.RequestCost, int, bool]:
    """Per-worker groups and bytes per block, the block count, the request cost and the
    planned ``max_model_len`` with whether it was auto-fitted."""
    worker_groups = [sizing.project_groups(groups, specs.keys()) for specs in specs_per_worker]
    bpb = [pool_bytes_per_block(builder, config, wg) for wg in worker_groups]
    num_blocks = sizing.blocks_from_memory(config, bpb, available)
    cost = sizing.RequestCost(groups, config)
    length, fitted = sizing.fit_max_model_len(config, cost, num_blocks, bpb, available, limit)
    return worker_groups, bpb, num_blocks, cost, length, fitted


def _lengths(max_model_len: int, context_lengths: Iterable[int] | None) -> list[int]:
    extra = []
    for length in context_lengths or ():
        check_int("plan_kv_cache", "context_lengths", length, error=PlanningError)
        if length != max_model_len and length not in extra:
            extra.append(length)
    return [max_model_len, *sorted(extra)]


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
    concurrency points besides ``max_model_len``."""
    specs_per_worker, available = kv_cache_specs_per_worker, available_memory_per_worker
    _check_inputs(specs_per_worker, available)
    limit = DEFAULT_MAX_MODEL_LEN_LIMIT if max_model_len_limit is None else max_model_len_limit
    check_int("plan_kv_cache", "max_model_len_limit", limit, error=PlanningError)
    merged = sizing.merge_worker_specs(specs_per_worker)
    KVCacheSpecRegistry.check_kv_cache_spec_registry(merged)
    merged = with_retained_tokens(merged, config.scheduler.num_lookahead_tokens)
    builder = get_kv_cache_config_builder(config)
    groups, alternatives = _group(builder, config, merged)
    sized = _size(builder, config, groups, specs_per_worker, available, limit)
    if sized[-1] and alternatives:
        # Auto-fitted: a rule that scored groupings scores them again at the length that fits.
        # The alternatives are always reported at that length, even when the groups stay.
        regrouped, alternatives = _group(builder, config.replace(max_model_len=sized[-2]), merged)
        if regrouped != groups:
            groups = regrouped
            sized = _size(builder, config, groups, specs_per_worker, available, limit)
    worker_groups, bpb, num_blocks, cost, length, fitted = sized
    final = config if config.max_model_len == length else config.replace(max_model_len=length)
    replicas = sizing.kv_tp_replicas(groups, config.parallel.tensor_parallel_size)
    configs = []
    for w, wg in enumerate(worker_groups):
        planned = builder.get_kv_cache_config_from_groups(final, wg, num_blocks)
        validate_worker_config(planned, wg, num_blocks, available[w], w, builder)
        configs.append(dataclasses.replace(planned, max_model_len=length, kv_tp_replicas=replicas))
    reports = sizing.group_reports(groups, cost, length)
    points = [
        sizing.concurrency_point(cost, n, num_blocks, max(bpb))
        for n in _lengths(length, context_lengths)
    ]
    waste_bytes, waste_fraction = sizing.request_waste(reports)
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
        for w, c in enumerate(configs)
    )
    return KVCachePlan(
        configs=tuple(configs),
        workers=tuple(workers),
        block_size=sizing.scheduler_block_size(groups, config.block_size),
        num_blocks=num_blocks,
        usable_blocks=num_blocks - 1,
        bytes_per_block=max(bpb),
        total_bytes_per_block=sum(bpb),
        groups=tuple(reports),
        max_model_len=length,
        max_model_len_auto_fitted=fitted,
        largest_max_model_len=(
            length if fitted else cost.largest_fitting(num_blocks - 1, max(limit, length))
        ),
        max_concurrency=tuple(points),
        token_capacity=points[0].token_capacity,
        full_attention_token_capacity=sizing.full_attention_token_capacity(groups, num_blocks),
        waste_bytes_per_request=waste_bytes,
        waste_fraction=waste_fraction,
        alternatives=alternatives,
        kv_tp_replicas=replicas,
        kv_cache_layout=configs[0].kv_cache_layout or resolve_kv_cache_layout(config),
    )


def get_kv_cache_configs(
    config: EngineConfig,
    kv_cache_specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
    available_memory_per_worker: Sequence[int],
    *,
    max_model_len_limit: int | None = None,
) -> list[KVCacheConfig]:
    """One KV cache config per worker, all with the same ``num_blocks`` (the configs of
    ``plan_kv_cache``; each config's ``max_model_len`` is the one planned)."""
    plan = plan_kv_cache(
        config,
        kv_cache_specs_per_worker,
        available_memory_per_worker,
        max_model_len_limit=max_model_len_limit,
    )
    return list(plan.configs)
