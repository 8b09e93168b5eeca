"""The cross-worker planner: specs and free memory per worker to one config each."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pagedkv.config import EngineConfig
from pagedkv.errors import PlanningError
from pagedkv.planning.builder import (
    DefaultKVCacheConfigBuilder,
    KVCacheConfigBuilder,
    get_kv_cache_config_builder,
)
from pagedkv.planning.grouping import with_retained_tokens
from pagedkv.planning.memory import RequestCost, blocks_from_memory, fit_max_model_len
from pagedkv.planning.parallel import kv_tp_replicas, merge_worker_specs, project_groups
from pagedkv.planning.partition import check_exact_partition
from pagedkv.planning.report import GroupingAlternative
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
from pagedkv.planning.validate import pool_bytes_per_block, validate_worker_config
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs.base import KVCacheSpec

# Upper bound for max_model_len=-1 when nothing else bounds it (local-only models).
DEFAULT_MAX_MODEL_LEN_LIMIT = 1 << 24


@dataclass(frozen=True)
class WorkerPlan:
    """What the planner decided, before and beside the per-worker configs."""

    configs: tuple[KVCacheConfig, ...]
    groups: tuple[KVCacheGroupSpec, ...]
    alternatives: tuple[GroupingAlternative, ...]
    bytes_per_block: tuple[int, ...]
    max_model_len: int
    auto_fitted: bool
    cost: RequestCost


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


def _uses_default_search(builder: KVCacheConfigBuilder, config: EngineConfig) -> bool:
    return (
        isinstance(builder, DefaultKVCacheConfigBuilder)
        and type(builder).get_kv_cache_groups is DefaultKVCacheConfigBuilder.get_kv_cache_groups
        and config.model.kv_cache_grouping is None
    )


def _group(
    builder: KVCacheConfigBuilder, config: EngineConfig, specs: Mapping[str, KVCacheSpec]
) -> tuple[tuple[KVCacheGroupSpec, ...], tuple[GroupingAlternative, ...]]:
    if _uses_default_search(builder, config):
        assert isinstance(builder, DefaultKVCacheConfigBuilder)
        choice = builder.choose_kv_cache_groups(config, specs)
        groups, alternatives = choice.groups, choice.alternatives
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


class _Sizing(NamedTuple):
    worker_groups: list[list[KVCacheGroupSpec]]
    bytes_per_block: list[int]
    num_blocks: int
    max_model_len: int
    auto_fitted: bool
    cost: RequestCost


def _size(
    builder: KVCacheConfigBuilder,
    config: EngineConfig,
    groups: Sequence[KVCacheGroupSpec],
    specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
    available: Sequence[int],
    limit: int,
) -> _Sizing:
    worker_groups = [project_groups(groups, specs.keys()) for specs in specs_per_worker]
    bpb = [pool_bytes_per_block(builder, config, wg) for wg in worker_groups]
    num_blocks = blocks_from_memory(config, bpb, available)
    cost = RequestCost(groups, config)
    length, fitted = fit_max_model_len(config, cost, num_blocks, bpb, available, limit)
    return _Sizing(worker_groups, bpb, num_blocks, length, fitted, cost)


def plan_workers(
    config: EngineConfig,
    kv_cache_specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
    available_memory_per_worker: Sequence[int],
    *,
    max_model_len_limit: int | None = None,
) -> WorkerPlan:
    """The whole planning flow; ``get_kv_cache_configs`` returns its configs."""
    specs_per_worker, available = kv_cache_specs_per_worker, available_memory_per_worker
    _check_inputs(specs_per_worker, available)
    limit = DEFAULT_MAX_MODEL_LEN_LIMIT if max_model_len_limit is None else max_model_len_limit
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        raise PlanningError(f"max_model_len_limit must be a positive integer, got {limit!r}")
    merged = merge_worker_specs(specs_per_worker)
    KVCacheSpecRegistry.check_kv_cache_spec_registry(merged)
    merged = with_retained_tokens(merged, config.scheduler.num_lookahead_tokens)
    builder = get_kv_cache_config_builder(config)
    groups, alternatives = _group(builder, config, merged)
    sized = _size(builder, config, groups, specs_per_worker, available, limit)
    if sized.auto_fitted and _uses_default_search(builder, config) and merged:
        # Auto-fitted: score the groupings again at the length that fits.
        refit = config.replace(max_model_len=sized.max_model_len)
        regrouped, realternatives = _group(builder, refit, merged)
        if regrouped != groups:
            groups, alternatives = regrouped, realternatives
            sized = _size(builder, config, groups, specs_per_worker, available, limit)
    worker_groups, bpb, num_blocks, length, fitted, cost = sized
    final = config if config.max_model_len == length else config.replace(max_model_len=length)
    replicas = kv_tp_replicas(groups, config.parallel.tensor_parallel_size)
    configs = []
    for w, wg in enumerate(worker_groups):
        planned = builder.get_kv_cache_config_from_groups(final, wg, num_blocks)
        validate_worker_config(planned, wg, num_blocks, available[w], w, builder)
        configs.append(dataclasses.replace(planned, max_model_len=length, kv_tp_replicas=replicas))
    return WorkerPlan(tuple(configs), groups, alternatives, tuple(bpb), length, fitted, cost)


def get_kv_cache_configs(
    config: EngineConfig,
    kv_cache_specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
    available_memory_per_worker: Sequence[int],
    *,
    max_model_len_limit: int | None = None,
) -> list[KVCacheConfig]:
    """One KV cache config per worker, all with the same ``num_blocks``.

    Merges the workers' specs, groups them with the platform's builder, reserves the
    null block, turns memory (or ``num_gpu_blocks_override``) into blocks, gives
    every worker the smallest count and checks one ``max_model_len`` request fits
    (``-1``: the largest length that fits, at most ``max_model_len_limit``).
    """
    plan = plan_workers(
        config,
        kv_cache_specs_per_worker,
        available_memory_per_worker,
        max_model_len_limit=max_model_len_limit,
    )
    return list(plan.configs)
