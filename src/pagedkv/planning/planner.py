"""The cross-worker planner: specs and free memory per worker to one config each, and
the checks it runs on any builder's output. ``pagedkv.capacity`` reports on its result."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from pagedkv.config import EngineConfig, check_int
from pagedkv.errors import InsufficientMemoryError, PlanningError
from pagedkv.planning import sizing
from pagedkv.planning.builder import (
    DefaultKVCacheConfigBuilder,
    KVCacheConfigBuilder,
    get_kv_cache_config_builder,
)
from pagedkv.planning.grouping import (
    check_exact_partition,
    mark_eagle_groups,
    with_retained_tokens,
)
from pagedkv.planning.placement import check_regions
from pagedkv.planning.sharing import add_kv_sharing_layers, check_kv_sharing
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs.base import KVCacheSpec

__all__ = [
    "DEFAULT_MAX_MODEL_LEN_LIMIT",
    "Groups",
    "pool_bytes_per_block",
    "validate_worker_config",
    "check_device_bytes",
    "PlannedKVCache",
    "plan_kv_cache_configs",
    "get_kv_cache_configs",
]

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
) -> tuple[Groups, tuple[Any, ...]]:
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
    if config.scheduler.use_eagle_block_drop:
        groups = mark_eagle_groups(groups, specs)
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
    """Raise PlanningError (InsufficientMemoryError for memory) if a builder broke a rule.

    Args:
        config: the KV cache config the builder returned.
        groups: the groups the builder was asked to place.
        num_blocks: the block count the builder was asked for.
        available: bytes available on this worker.
        worker: the worker's index, named in messages.
        builder: the builder that planned ``config``, named in messages.
    """
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
    check_device_bytes(config, available, worker, builder)
    check_regions(config, worker)


def check_device_bytes(
    config: KVCacheConfig, available: int, worker: int, builder: KVCacheConfigBuilder
) -> None:
    """Raise InsufficientMemoryError if ``config``'s device tensors exceed ``available`` bytes.

    Args:
        config: the worker's planned KV cache config.
        available: bytes available on this worker.
        worker: the worker's index, named in the message.
        builder: the builder that planned ``config``, named in the message.
    """
    device_bytes = sum({t.size for t in config.device_tensors})
    if device_bytes > available:
        raise InsufficientMemoryError(
            f"{type(builder).__qualname__} placed {device_bytes} bytes of device tensors on worker "
            f"{worker}, which has {available} bytes available"
        )


class PlannedKVCache(NamedTuple):
    """One planning pass: every worker's config and what the capacity report reads."""

    config: EngineConfig
    configs: tuple[KVCacheConfig, ...]
    groups: Groups  # global groups (all workers' layers)
    bytes_per_block: tuple[int, ...]  # per worker
    num_blocks: int
    cost: sizing.RequestCost
    max_model_len: int
    max_model_len_auto_fitted: bool
    max_model_len_limit: int
    alternatives: tuple[Any, ...]  # what a searching grouping rule scored
    kv_tp_replicas: int


class _Sized(NamedTuple):
    """One sizing pass over a grouping."""

    worker_groups: list[list[KVCacheGroupSpec]]  # each worker's groups
    bytes_per_block: list[int]  # per worker
    num_blocks: int
    cost: sizing.RequestCost
    max_model_len: int  # tokens
    max_model_len_auto_fitted: bool


def _size(
    builder: KVCacheConfigBuilder,
    config: EngineConfig,
    groups: Groups,
    specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
    available: Sequence[int],
    limit: int,
) -> _Sized:
    """Per-worker groups and bytes per block, the block count, the request cost and the
    planned ``max_model_len`` with whether it was auto-fitted."""
    worker_groups = [sizing.project_groups(groups, specs.keys()) for specs in specs_per_worker]
    bpb = [pool_bytes_per_block(builder, config, wg) for wg in worker_groups]
    num_blocks = sizing.blocks_from_memory(config, bpb, available)
    cost = sizing.RequestCost(groups, config)
    length, fitted = sizing.fit_max_model_len(config, cost, num_blocks, bpb, available, limit)
    return _Sized(worker_groups, bpb, num_blocks, cost, length, fitted)


def plan_kv_cache_configs(
    config: EngineConfig,
    kv_cache_specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
    available_memory_per_worker: Sequence[int],
    *,
    max_model_len_limit: int | None = None,
    shared_kv_cache_layers: Mapping[str, str] | None = None,
) -> PlannedKVCache:
    """Plan every worker's KV cache in one pass (the flow in docs/planning.md):
    ``max_model_len=-1`` fits the largest length the blocks hold, at most
    ``max_model_len_limit``. ``shared_kv_cache_layers`` maps a layer with no spec to the
    layer whose cache it reads; it joins that layer's group in the configs.

    Args:
        config: the engine config (``max_model_len=-1`` fits the length).
        kv_cache_specs_per_worker: each worker's layer name -> KV cache spec.
        available_memory_per_worker: bytes each worker can give the KV cache.
        max_model_len_limit: the most tokens an auto-fitted ``max_model_len`` may take (None: the
            planner's default).
        shared_kv_cache_layers: layer without a spec -> the layer whose cache it reads.
    """
    specs_per_worker, available = kv_cache_specs_per_worker, available_memory_per_worker
    _check_inputs(specs_per_worker, available)
    limit = DEFAULT_MAX_MODEL_LEN_LIMIT if max_model_len_limit is None else max_model_len_limit
    check_int("plan_kv_cache_configs", "max_model_len_limit", limit, error=PlanningError)
    merged = sizing.merge_worker_specs(specs_per_worker)
    shared = dict(shared_kv_cache_layers or {})
    check_kv_sharing(shared, merged)
    KVCacheSpecRegistry.check_kv_cache_spec_registry(merged)
    merged = with_retained_tokens(merged, config.scheduler.num_prefill_lookahead_tokens)
    builder = get_kv_cache_config_builder(config)
    groups, alternatives = _group(builder, config, merged)
    sized = _size(builder, config, groups, specs_per_worker, available, limit)
    if sized.max_model_len_auto_fitted and alternatives:
        # Auto-fitted: a rule that scored groupings scores them again at the length that fits.
        # The alternatives are always reported at that length, even when the groups stay.
        refit = config.replace(max_model_len=sized.max_model_len)
        regrouped, alternatives = _group(builder, refit, merged)
        if regrouped != groups:
            groups = regrouped
            sized = _size(builder, config, groups, specs_per_worker, available, limit)
    worker_groups, bpb, num_blocks, cost, length, fitted = sized
    final = config if config.max_model_len == length else config.replace(max_model_len=length)
    replicas = sizing.kv_tp_replicas(groups, config.parallel.tensor_parallel_size)
    # Workers with the same groups (the TP ranks of a stage) share one placed, checked config.
    placed: dict[Groups, KVCacheConfig] = {}
    configs = []
    for w, wg in enumerate(worker_groups):
        key = tuple(wg)
        if key in placed:
            check_device_bytes(placed[key], available[w], w, builder)
        else:
            planned = builder.get_kv_cache_config_from_groups(final, wg, num_blocks)
            validate_worker_config(planned, wg, num_blocks, available[w], w, builder)
            planned = dataclasses.replace(planned, max_model_len=length, kv_tp_replicas=replicas)
            placed[key] = add_kv_sharing_layers(planned, shared)
        configs.append(placed[key])
    return PlannedKVCache(
        config,
        tuple(configs),
        groups,
        tuple(bpb),
        num_blocks,
        cost,
        length,
        fitted,
        limit,
        alternatives,
        replicas,
    )


def get_kv_cache_configs(
    config: EngineConfig,
    kv_cache_specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
    available_memory_per_worker: Sequence[int],
    *,
    max_model_len_limit: int | None = None,
    shared_kv_cache_layers: Mapping[str, str] | None = None,
) -> list[KVCacheConfig]:
    """One KV cache config per worker, all with the same ``num_blocks`` (each config's
    ``max_model_len`` is the one planned).

    Args:
        config: the engine config (``max_model_len=-1`` fits the length).
        kv_cache_specs_per_worker: each worker's layer name -> KV cache spec.
        available_memory_per_worker: bytes each worker can give the KV cache.
        max_model_len_limit: the most tokens an auto-fitted ``max_model_len`` may take (None: the
            planner's default).
        shared_kv_cache_layers: layer without a spec -> the layer whose cache it reads.
    """
    planned = plan_kv_cache_configs(
        config,
        kv_cache_specs_per_worker,
        available_memory_per_worker,
        max_model_len_limit=max_model_len_limit,
        shared_kv_cache_layers=shared_kv_cache_layers,
    )
    return list(planned.configs)
