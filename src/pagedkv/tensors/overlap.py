"""Proof that a plan's layer regions never clobber each other.

Two pages may share bytes only when they are the same block id of layers in different
groups: a block id belongs to one group at a time, so such aliasing (cross-group slot
sharing) is how a hybrid plan reuses memory. Any other overlap is a plan bug.

Pages of a region are affine in the block id, so two regions with the same block stride
are compared in closed form (the block-id differences that make their pages meet);
other pairs fall back to a sweep over their pages.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from itertools import chain, combinations_with_replacement, islice
from typing import NamedTuple

from pagedkv.planning.types import KVCacheConfig, KVCacheTensor, LayerRegion

__all__ = [
    "UnsafeOverlap",
    "sweep_unsafe_overlaps",
    "find_unsafe_overlaps",
]


class UnsafeOverlap(NamedTuple):
    """Layer ``layer_a``'s page of ``block_a`` shares bytes with ``layer_b``'s of ``block_b``."""

    layer_a: str
    block_a: int
    layer_b: str
    block_b: int


def _group_ids(config: KVCacheConfig) -> dict[str, int]:
    return {name: gid for gid, g in enumerate(config.kv_cache_groups) for name in g.layer_names}


def _allowed(
    a: LayerRegion, block_a: int, b: LayerRegion, block_b: int, groups: dict[str, int]
) -> bool:
    different_groups = groups.get(a.layer_name) != groups.get(b.layer_name)
    return block_a == block_b and a.layer_name != b.layer_name and different_groups


def _closed_form(
    a: LayerRegion, b: LayerRegion, num_blocks: int, groups: dict[str, int]
) -> Iterator[UnsafeOverlap]:
    """Pages ``i`` of ``a`` and ``j`` of ``b`` meet iff ``-page_a < d < page_b`` with
    ``d = a.offset - b.offset + (i - j) * stride``: only a few ``k = i - j`` qualify."""
    stride, delta = a.block_stride, a.offset - b.offset
    low = -(a.page_size_bytes + delta) // stride + 1  # smallest k with d > -page_a
    high = -(-(b.page_size_bytes - delta) // stride) - 1  # largest k with d < page_b
    for k in range(max(low, 1 - num_blocks), min(high, num_blocks - 1) + 1):
        block_a = max(k, 0)
        block_b = block_a - k
        if a == b and k == 0:
            continue
        if not _allowed(a, block_a, b, block_b, groups):
            yield UnsafeOverlap(a.layer_name, block_a, b.layer_name, block_b)


def _sweep(
    regions: list[LayerRegion], num_blocks: int, groups: dict[str, int]
) -> Iterator[UnsafeOverlap]:
    pages = sorted(
        (r.offset + block * r.block_stride, index, block)
        for index, r in enumerate(regions)
        for block in range(num_blocks)
    )
    active: list[tuple[int, int, int]] = []  # (end, region index, block), a heap on end
    for start, index, block in pages:
        while active and active[0][0] <= start:
            heapq.heappop(active)
        region = regions[index]
        for _, other_index, other_block in active:
            other = regions[other_index]
            if not _allowed(other, other_block, region, block, groups):
                yield UnsafeOverlap(other.layer_name, other_block, region.layer_name, block)
        heapq.heappush(active, (start + region.page_size_bytes, index, block))


def _overlaps_in(
    tensors: tuple[KVCacheTensor, ...], num_blocks: int, groups: dict[str, int]
) -> Iterator[UnsafeOverlap]:
    regions = [r for t in tensors for r in t.regions() if r.page_size_bytes > 0]
    for a, b in combinations_with_replacement(regions, 2):
        if a.block_stride == b.block_stride and a.block_stride > 0:
            yield from _closed_form(a, b, num_blocks, groups)
        else:
            yield from _sweep([a, b] if a != b else [a], num_blocks, groups)


def sweep_unsafe_overlaps(config: KVCacheConfig, *, limit: int = 16) -> list[UnsafeOverlap]:
    """The same answer as :func:`find_unsafe_overlaps` by brute force over every page of
    the device tensors (slow; the oracle the closed form is tested against)."""
    regions = [r for t in config.device_tensors for r in t.regions() if r.page_size_bytes > 0]
    return list(islice(_sweep(regions, config.num_blocks, _group_ids(config)), limit))


def find_unsafe_overlaps(
    config: KVCacheConfig, *, num_host_blocks: int | None = None, limit: int = 16
) -> list[UnsafeOverlap]:
    """Pairs of pages (up to ``limit``) that overlap without being shared on purpose.

    Device tensors are checked over ``config.num_blocks`` blocks; host-resident tensors,
    a separate buffer, over ``num_host_blocks`` (default: the same count). Pure Python,
    no torch needed; cost grows with the square of the number of layers, not with blocks.
    """
    groups = _group_ids(config)
    host_blocks = config.num_blocks if num_host_blocks is None else num_host_blocks
    device = _overlaps_in(config.device_tensors, config.num_blocks, groups)
    host = _overlaps_in(config.host_tensors, host_blocks, groups)
    return list(islice(chain(device, host), limit))
