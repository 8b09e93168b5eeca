"""Checking a placement: regions in bounds, and aliasing only where it is safe.

Aliasing rule. Region ``k`` (one layer in one tensor) uses bytes
``o_k + b * S_k + [0, p_k)`` for block ids ``b`` in ``[0, N)``. Two regions may share
a byte only if (1) they belong to different groups and (2) the byte has the same
block id in both. A block id belongs to one group at a time, so such bytes are
never live for two layers at once. This is how the default layout shares layer
slot ``i`` among layer ``i`` of every group (same offset and stride), and how a
block-outer layout lets every group fill the same ``bytes_per_block`` bytes.
Sharing at different block ids, or inside one group, is an error.

The check is exact for regions with equal block strides (every layout pagedkv
builds). Regions with different strides whose byte spans overlap are rejected
without looking closer, which may refuse an unusual but safe custom layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pagedkv.errors import PlanningError
from pagedkv.specs.base import cdiv


class PlacedRegion(NamedTuple):
    offset: int
    block_stride: int
    page_size_bytes: int
    group_id: int
    layer_name: str


def _end(r: PlacedRegion, num_blocks: int) -> int:
    return r.offset + (num_blocks - 1) * r.block_stride + r.page_size_bytes


def _overlap_ids(a: PlacedRegion, b: PlacedRegion, num_blocks: int) -> tuple[bool, bool]:
    """(share a byte at the same block id, share a byte at different block ids)."""
    if num_blocks == 1 or a.block_stride != b.block_stride:
        same = a.offset < b.offset + b.page_size_bytes and b.offset < a.offset + a.page_size_bytes
        return same, num_blocks > 1 and a.block_stride != b.block_stride
    stride, d = a.block_stride, b.offset - a.offset
    # Bytes coincide when (ida - idb) * stride lies in [d - pa + 1, d + pb - 1].
    lo, hi = d - a.page_size_bytes + 1, d + b.page_size_bytes - 1
    same = lo <= 0 <= hi
    k_lo, k_hi = max(cdiv(lo, stride), 1 - num_blocks), min(hi // stride, num_blocks - 1)
    other = k_lo <= k_hi and not k_lo == 0 == k_hi
    return same, other


def _pair_error(a: PlacedRegion, b: PlacedRegion, why: str) -> PlanningError:
    return PlanningError(
        f"KV cache regions of layers {a.layer_name!r} (group {a.group_id}) and "
        f"{b.layer_name!r} (group {b.group_id}) overlap {why}"
    )


def check_aliasing(regions: Sequence[PlacedRegion], num_blocks: int) -> None:
    """Raise PlanningError naming two layers whose regions overlap unsafely."""
    by_key: dict[tuple[int, int, int], list[PlacedRegion]] = {}
    for r in regions:
        by_key.setdefault((r.offset, r.block_stride, r.page_size_bytes), []).append(r)
    for members in by_key.values():
        seen: dict[int, PlacedRegion] = {}
        for r in members:
            if r.group_id in seen:
                raise _pair_error(seen[r.group_id], r, "inside one group")
            seen[r.group_id] = r
    uniques = sorted(by_key.values(), key=lambda m: m[0].offset)
    active: list[list[PlacedRegion]] = []
    for members in uniques:
        head = members[0]
        active = [m for m in active if _end(m[0], num_blocks) > head.offset]
        for other in active:
            same, different = _overlap_ids(other[0], head, num_blocks)
            if different:
                raise _pair_error(other[0], head, "at different block ids")
            if same:
                groups = {r.group_id for r in other}
                clash = [r for r in members if r.group_id in groups]
                if clash:
                    mate = next(r for r in other if r.group_id == clash[0].group_id)
                    raise _pair_error(mate, clash[0], "inside one group")
        active.append(members)
