"""Proof that a plan's layer regions never clobber each other.

Two pages may share bytes only when they are the same block id of layers in different
groups: a block id belongs to one group at a time, so such aliasing (cross-group slot
sharing) is how a hybrid plan reuses memory. Any other overlap is a plan bug.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

from pagedkv.planning.types import KVCacheConfig, KVCacheTensor


class UnsafeOverlap(NamedTuple):
    """Layer ``layer_a``'s page of ``block_a`` shares bytes with ``layer_b``'s of ``block_b``."""

    layer_a: str
    block_a: int
    layer_b: str
    block_b: int


def _group_ids(config: KVCacheConfig) -> dict[str, int]:
    return {name: gid for gid, g in enumerate(config.kv_cache_groups) for name in g.layer_names}


def _overlaps_in(
    tensors: tuple[KVCacheTensor, ...], num_blocks: int, groups: dict[str, int], limit: int
) -> list[UnsafeOverlap]:
    pages = sorted(
        (r.offset + b * r.block_stride, r.page_size_bytes, r.layer_name, b)
        for t in tensors
        for r in t.regions()
        for b in range(num_blocks)
        if r.page_size_bytes > 0
    )
    found: list[UnsafeOverlap] = []
    active: list[tuple[int, str, int]] = []  # (end, layer, block), a heap on end
    for start, size, layer, block in pages:
        while active and active[0][0] <= start:
            heapq.heappop(active)
        for _, other, other_block in active:
            shared_on_purpose = block == other_block and groups.get(layer) != groups.get(other)
            if not shared_on_purpose:
                found.append(UnsafeOverlap(other, other_block, layer, block))
                if len(found) >= limit:
                    return found
        heapq.heappush(active, (start + size, layer, block))
    return found


def find_unsafe_overlaps(
    config: KVCacheConfig, *, num_host_blocks: int | None = None, limit: int = 16
) -> list[UnsafeOverlap]:
    """Every pair of pages (up to ``limit``) that overlap without being shared on purpose.

    Device tensors are checked over ``config.num_blocks`` blocks; host-resident tensors,
    a separate buffer, over ``num_host_blocks`` (default: the same count). Pure Python,
    no torch needed; cost grows with layers x blocks.
    """
    groups = _group_ids(config)
    host_blocks = config.num_blocks if num_host_blocks is None else num_host_blocks
    found = _overlaps_in(config.device_tensors, config.num_blocks, groups, limit)
    return found + _overlaps_in(config.host_tensors, host_blocks, groups, limit - len(found))
