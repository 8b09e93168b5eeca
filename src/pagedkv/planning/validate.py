"""What the planner checks on any builder's output."""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.config import EngineConfig
from pagedkv.errors import InsufficientMemoryError, PlanningError
from pagedkv.planning.builder import KVCacheConfigBuilder
from pagedkv.planning.partition import check_exact_partition
from pagedkv.planning.placement import layer_pages
from pagedkv.planning.regions import PlacedRegion, check_aliasing
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec


def _has_device_layers(groups: Sequence[KVCacheGroupSpec]) -> bool:
    return any(g.layer_names and not g.host_resident for g in groups)


def _overrides_pool_hook(builder: KVCacheConfigBuilder) -> bool:
    return (
        type(builder)._get_pool_bytes_per_block
        is not KVCacheConfigBuilder._get_pool_bytes_per_block
    )


def pool_bytes_per_block(
    builder: KVCacheConfigBuilder, config: EngineConfig, groups: Sequence[KVCacheGroupSpec]
) -> int:
    """Device bytes one block id costs on a worker: the builder's answer, else a probe."""
    if not _has_device_layers(groups):
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


def _device_bytes(config: KVCacheConfig, builder: KVCacheConfigBuilder, worker: int) -> int:
    sizes = {t.size for t in config.device_tensors}
    if len(sizes) > 1 and not _overrides_pool_hook(builder):
        raise PlanningError(
            f"{type(builder).__qualname__} placed worker {worker}'s device tensors in "
            f"allocations of different sizes {sorted(sizes)}; they must share one"
        )
    return sum(sizes)


def _check_regions(config: KVCacheConfig, worker: int) -> None:
    pages = {n: page for g in config.kv_cache_groups for n, page in layer_pages(g)}
    group_of = {n: gid for gid, g in enumerate(config.kv_cache_groups) for n in g.layer_names}
    n = config.num_blocks
    allocations: dict[tuple[bool, int], list[PlacedRegion]] = {}
    seen: set[str] = set()
    for tensor in config.kv_cache_tensors:
        for region in tensor.regions():
            name = region.layer_name
            if name not in group_of:
                raise PlanningError(f"worker {worker}: tensor backs {name!r}, a layer in no group")
            if name in seen:
                raise PlanningError(f"worker {worker}: layer {name!r} is backed by two tensors")
            seen.add(name)
            end = region.offset + (n - 1) * region.block_stride + region.page_size_bytes
            if region.offset < 0 or end > tensor.size:
                raise PlanningError(
                    f"worker {worker}: layer {name!r} needs bytes [{region.offset}, {end}) "
                    f"of a {tensor.size}-byte tensor"
                )
            if region.page_size_bytes < pages[name]:
                raise PlanningError(
                    f"worker {worker}: layer {name!r} region holds {region.page_size_bytes} "
                    f"bytes per block, its page needs {pages[name]}"
                )
            if n > 1 and 0 < region.block_stride < region.page_size_bytes:
                raise PlanningError(f"worker {worker}: layer {name!r} blocks overlap each other")
            placed = PlacedRegion(
                region.offset, region.block_stride, region.page_size_bytes, group_of[name], name
            )
            allocations.setdefault((tensor.host_resident, tensor.size), []).append(placed)
    missing = set(group_of) - seen
    if missing:
        raise PlanningError(f"worker {worker}: layers with no tensor: {sorted(missing)[:8]}")
    for regions in allocations.values():
        check_aliasing(regions, n)


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
    device_bytes = _device_bytes(config, builder, worker)
    if device_bytes > available:
        raise InsufficientMemoryError(
            f"{name} placed {device_bytes} bytes of device tensors on worker {worker}, "
            f"which has {available} bytes available"
        )
    _check_regions(config, worker)
