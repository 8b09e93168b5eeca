"""Placing groups in one backing allocation per residency (device, host).

Layer-slot placement (default): slot ``i`` is a ``page * num_blocks`` byte range
shared by layer ``i`` of every group, block ``b`` at ``slot + b * page``. It needs
every group to have the same page at slot ``i``. When groups disagree (a model or
custom grouping with unequal pages) the block-outer placement is used instead: block
``b`` is bytes ``[b * bpb, (b + 1) * bpb)`` and a group packs its layers inside.
Both satisfy the aliasing rule in ``regions``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.config import EngineConfig
from pagedkv.errors import ConfigError
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from pagedkv.platforms import get_current_platform
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

KV_CACHE_LAYOUTS = ("NHD", "HND")


def resolve_kv_cache_layout(config: EngineConfig) -> str:
    """Per-block layout: CacheConfig.kv_cache_layout, else the platform's default."""
    name = config.cache.kv_cache_layout or get_current_platform().default_kv_cache_layout()
    layout = str(name).upper()
    if layout not in KV_CACHE_LAYOUTS:
        raise ConfigError(
            f"CacheConfig.kv_cache_layout must be one of {', '.join(KV_CACHE_LAYOUTS)}, "
            f"got {name!r}"
        )
    return layout


def _page_runs(group: KVCacheGroupSpec) -> list[tuple[int, list[str]]]:
    """Consecutive layers with equal pages: one run for a plain group (page computed once)."""
    spec = group.kv_cache_spec
    if not isinstance(spec, UniformTypeKVCacheSpecs):
        return [(spec.page_size_bytes, list(group.layer_names))] if group.layer_names else []
    runs: list[tuple[int, list[str]]] = []
    for name in group.layer_names:
        page = spec.kv_cache_specs[name].page_size_bytes
        if runs and runs[-1][0] == page:
            runs[-1][1].append(name)
        else:
            runs.append((page, [name]))
    return runs


def layer_pages(group: KVCacheGroupSpec) -> list[tuple[str, int]]:
    """(layer, page bytes) in group order."""
    return [(name, page) for page, names in _page_runs(group) for name in names]


def _width(runs: list[tuple[int, list[str]]]) -> int:
    return sum(page * len(names) for page, names in runs)


def group_width_bytes(group: KVCacheGroupSpec) -> int:
    """Bytes one block id costs this group (sum of its layers' pages)."""
    return _width(_page_runs(group))


def bytes_per_block(groups: Sequence[KVCacheGroupSpec], *, host: bool = False) -> int:
    return max((group_width_bytes(g) for g in groups if g.host_resident == host), default=0)


def _runs_agree(runs_per_group: Sequence[list[tuple[int, list[str]]]]) -> bool:
    """Whether layer slot i has the same page in every group that has an i-th layer."""
    slot_pages: list[int] = []
    for runs in runs_per_group:
        slot = 0
        for page, names in runs:
            for i in range(slot, slot + len(names)):
                if i == len(slot_pages):
                    slot_pages.append(page)
                elif slot_pages[i] != page:
                    return False
            slot += len(names)
    return True


def place(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int, *, host: bool = False
) -> list[KVCacheTensor]:
    """Tensors for the groups of one residency in one ``bpb * num_blocks`` allocation."""
    runs_per_group = [_page_runs(g) for g in groups if g.host_resident == host]
    bpb = max((_width(runs) for runs in runs_per_group), default=0)
    if bpb == 0:
        return []
    size = bpb * num_blocks
    layer_major = _runs_agree(runs_per_group)
    tensors = []
    for runs in runs_per_group:
        offset = 0
        for page, names in runs:
            layer_stride = page * num_blocks if layer_major else page
            tensors.append(
                KVCacheTensor(
                    size=size,
                    layers=tuple(names),
                    layer_stride=layer_stride,
                    block_stride=page if layer_major else bpb,
                    page_size_bytes=page,
                    offset=offset,
                    host_resident=host,
                )
            )
            offset += len(names) * layer_stride
    return tensors


def place_groups(
    config: EngineConfig, groups: Sequence[KVCacheGroupSpec], num_blocks: int
) -> KVCacheConfig:
    """The default builder's placement: device groups, then host groups, for ``num_blocks``."""
    tensors = place(groups, num_blocks) + place(groups, num_blocks, host=True)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=tuple(tensors),
        kv_cache_groups=tuple(groups),
        kv_cache_layout=resolve_kv_cache_layout(config),
    )
