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


def layer_pages(group: KVCacheGroupSpec) -> list[tuple[str, int]]:
    """(layer, page bytes) in group order; a plain group's page is computed once."""
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return [(n, spec.kv_cache_specs[n].page_size_bytes) for n in group.layer_names]
    page = spec.page_size_bytes
    return [(n, page) for n in group.layer_names]


def group_width_bytes(group: KVCacheGroupSpec) -> int:
    """Bytes one block id costs this group (sum of its layers' pages)."""
    return sum(page for _, page in layer_pages(group))


def bytes_per_block(groups: Sequence[KVCacheGroupSpec], *, host: bool = False) -> int:
    return max((group_width_bytes(g) for g in groups if g.host_resident == host), default=0)


def _runs(pages: list[tuple[str, int]]) -> list[tuple[int, list[str]]]:
    runs: list[tuple[int, list[str]]] = []
    for name, page in pages:
        if runs and runs[-1][0] == page:
            runs[-1][1].append(name)
        else:
            runs.append((page, [name]))
    return runs


def slots_agree(groups: Sequence[KVCacheGroupSpec]) -> bool:
    slot_pages: list[int] = []
    for group in groups:
        for i, (_, page) in enumerate(layer_pages(group)):
            if i == len(slot_pages):
                slot_pages.append(page)
            elif slot_pages[i] != page:
                return False
    return True


def place(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int, *, host: bool = False
) -> list[KVCacheTensor]:
    """Tensors for the groups of one residency in one ``bpb * num_blocks`` allocation."""
    chosen = [g for g in groups if g.host_resident == host]
    bpb = bytes_per_block(chosen, host=host)
    if bpb == 0:
        return []
    size = bpb * num_blocks
    layer_major = slots_agree(chosen)
    tensors = []
    for group in chosen:
        offset = 0
        for page, names in _runs(layer_pages(group)):
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
