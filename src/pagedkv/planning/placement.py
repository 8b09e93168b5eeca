"""Placing groups in one backing allocation per residency (device, host): layer-slot
(slot ``i`` shared by layer ``i`` of every group), else block-outer when the groups'
pages disagree at a slot or the layout is block-outermost (``planning.layout``); and
checking any builder's placement against the aliasing rule: two regions share a byte
only in different groups at the same block id (docs/planning.md, "Placement and the
aliasing rule")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from pagedkv.config import EngineConfig
from pagedkv.errors import PlanningError
from pagedkv.planning.layout import (
    check_layout_expresses,
    is_block_outermost,
    resolve_kv_cache_layout,
)
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from pagedkv.specs.base import KVCacheSpec, cdiv
from pagedkv.specs.hisparse import HiSparseHotSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "Run",
    "PageRuns",
    "group_width_bytes",
    "bytes_per_block",
    "place",
    "place_groups",
    "PlacedRegion",
    "check_aliasing",
    "check_regions",
]


class Run(NamedTuple):
    """Layers of one spec in a group: their page, the page padded to the spec's block
    stride alignment (their block stride when each layer has its own region), names."""

    page: int
    stride: int
    names: list[str]


PageRuns = list[Run]


def _aligned(page: int, alignment: int) -> int:
    return cdiv(page, alignment) * alignment


def _page_runs(group: KVCacheGroupSpec) -> PageRuns:
    """The group's layers bucketed by spec in first-seen order (vLLM's tensor per spec):
    one run for a plain group (page computed once)."""
    spec = group.kv_cache_spec
    if not isinstance(spec, UniformTypeKVCacheSpecs):
        if not group.layer_names:
            return []
        page = spec.page_size_bytes
        stride = _aligned(page, spec.block_stride_alignment_bytes())
        return [Run(page, stride, list(group.layer_names))]
    runs: dict[KVCacheSpec, Run] = {}
    for name in group.layer_names:
        layer = spec.kv_cache_specs[name]
        run = runs.get(layer)
        if run is None:
            page = layer.page_size_bytes
            stride = _aligned(page, layer.block_stride_alignment_bytes())
            runs[layer] = run = Run(page, stride, [])
        run.names.append(name)
    return list(runs.values())


def _width(runs: PageRuns, block_outer: bool = True) -> int:
    """Bytes one block id costs: pages side by side (block-outer), else each layer's
    aligned stride."""
    return sum((r.page if block_outer else r.stride) * len(r.names) for r in runs)


def group_width_bytes(group: KVCacheGroupSpec) -> int:
    """Bytes one block id costs this group (sum of its layers' pages)."""
    return _width(_page_runs(group))


def bytes_per_block(
    groups: Sequence[KVCacheGroupSpec], *, host: bool = False, block_outer: bool = False
) -> int:
    """The widest group's bytes per block id: block-outer, its pages side by side
    rounded up to a multiple of every HiSparse hot page and layer alignment; else its
    layers' pages each padded to their alignment (vLLM's block stride rules)."""
    return _bpb([g for g in groups if g.host_resident == host], block_outer)


def _bpb(groups: Sequence[KVCacheGroupSpec], block_outer: bool) -> int:
    width = max((_width(_page_runs(g), block_outer) for g in groups), default=0)
    if not block_outer or width == 0:
        return width
    steps = [
        g.kv_cache_spec.page_size_bytes
        for g in groups
        if isinstance(g.kv_cache_spec, HiSparseHotSpec)
    ]
    steps += [s.block_stride_alignment_bytes() for g in groups for s in g.layer_specs().values()]
    step = math.lcm(*steps) if steps else 1
    return cdiv(width, step) * step


def _runs_agree(runs_per_group: Sequence[PageRuns]) -> bool:
    """Whether layer slot i has the same stride in every group that has an i-th layer."""
    slot_strides: list[int] = []
    for runs in runs_per_group:
        strides = [r.stride for r in runs for _ in r.names]
        common = min(len(strides), len(slot_strides))
        if strides[:common] != slot_strides[:common]:
            return False
        slot_strides += strides[common:]
    return True


def place(
    groups: Sequence[KVCacheGroupSpec],
    num_blocks: int,
    *,
    host: bool = False,
    block_outer: bool = False,
) -> list[KVCacheTensor]:
    """Tensors for the groups of one residency in one ``bpb * num_blocks`` allocation:
    layer-outer (a region per layer, blocks at its aligned page stride) when every
    group's layer slot ``i`` agrees, else (or when the layout is block-outermost) every
    group's layers side by side inside each block.

    Args:
        groups: all KV cache groups; only those of the residency chosen by ``host`` are placed.
        num_blocks: blocks in the allocation.
        host: place the host-resident groups instead of the device-resident ones.
        block_outer: lay blocks outermost (every group's layers side by side inside each block).
    """
    own = [g for g in groups if g.host_resident == host]
    runs_per_group = [_page_runs(g) for g in own]
    layer_major = not block_outer and _runs_agree(runs_per_group)
    if layer_major or block_outer:
        bpb = _bpb(own, block_outer)
    else:  # layer-outer layouts whose slots disagree: pages side by side, unrounded
        bpb = max(_width(runs) for runs in runs_per_group)
    if bpb == 0:
        return []
    tensors = []
    for runs in runs_per_group:
        offset = 0
        for run in runs:
            layer_stride = run.stride * num_blocks if layer_major else run.page
            tensors.append(
                KVCacheTensor(
                    size=bpb * num_blocks,
                    layers=tuple(run.names),
                    layer_stride=layer_stride,
                    block_stride=run.stride if layer_major else bpb,
                    page_size_bytes=run.page,
                    offset=offset,
                    host_resident=host,
                )
            )
            offset += len(run.names) * layer_stride
    return tensors


def place_groups(
    config: EngineConfig, groups: Sequence[KVCacheGroupSpec], num_blocks: int
) -> KVCacheConfig:
    """The default builder's placement: device groups, then host groups, for ``num_blocks``."""
    layout = resolve_kv_cache_layout(config)
    check_layout_expresses(layout, [g for g in groups if not g.host_resident])
    block_outer = is_block_outermost(layout)
    tensors = place(groups, num_blocks, block_outer=block_outer)
    tensors += place(groups, num_blocks, host=True)  # host tiers are always layer-outer
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=tuple(tensors),
        kv_cache_groups=tuple(groups),
        kv_cache_layout=layout,
    )


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
    k_lo, k_hi = max(cdiv(lo, stride), 1 - num_blocks), min(hi // stride, num_blocks - 1)
    return lo <= 0 <= hi, k_lo <= k_hi and not k_lo == 0 == k_hi


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
    active: list[list[PlacedRegion]] = []
    for members in sorted(by_key.values(), key=lambda m: m[0].offset):
        head = members[0]
        active = [m for m in active if _end(m[0], num_blocks) > head.offset]
        for other in active:
            same, different = _overlap_ids(other[0], head, num_blocks)
            if different:
                raise _pair_error(other[0], head, "at different block ids")
            groups = {r.group_id for r in other}
            clash = [r for r in members if r.group_id in groups] if same else []
            if clash:
                mate = next(r for r in other if r.group_id == clash[0].group_id)
                raise _pair_error(mate, clash[0], "inside one group")
        active.append(members)


def check_regions(config: KVCacheConfig, worker: int) -> None:
    """Every layer backed once, inside its tensor, by a region its page fits; no unsafe
    aliasing. Raises PlanningError naming the worker and layer."""
    pages = {n: r.page for g in config.kv_cache_groups for r in _page_runs(g) for n in r.names}
    group_of = {n: gid for gid, g in enumerate(config.kv_cache_groups) for n in g.layer_names}
    n = config.num_blocks
    allocations: dict[tuple[bool, int], list[PlacedRegion]] = {}
    for tensor in config.kv_cache_tensors:
        for region in tensor.regions():
            name = region.layer_name
            if name not in group_of:
                raise PlanningError(f"worker {worker}: tensor backs {name!r}, a layer in no group")
            if name not in pages:
                raise PlanningError(f"worker {worker}: layer {name!r} is backed by two tensors")
            end = region.block_range(n - 1)[1]
            if region.offset < 0 or end > tensor.size:
                raise PlanningError(
                    f"worker {worker}: layer {name!r} needs bytes [{region.offset}, {end}) "
                    f"of a {tensor.size}-byte tensor"
                )
            page = pages.pop(name)
            if region.page_size_bytes < page:
                raise PlanningError(
                    f"worker {worker}: layer {name!r} region holds {region.page_size_bytes} "
                    f"bytes per block, its page needs {page}"
                )
            if n > 1 and 0 < region.block_stride < region.page_size_bytes:
                raise PlanningError(f"worker {worker}: layer {name!r} blocks overlap each other")
            placed = PlacedRegion(
                region.offset, region.block_stride, region.page_size_bytes, group_of[name], name
            )
            allocations.setdefault((tensor.host_resident, tensor.size), []).append(placed)
    if pages:
        raise PlanningError(f"worker {worker}: layers with no tensor: {sorted(pages)[:8]}")
    for regions in allocations.values():
        check_aliasing(regions, n)
