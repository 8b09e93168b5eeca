"""Capacity: concurrency per context length, token capacity and padding waste."""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.planning.memory import RequestCost
from pagedkv.planning.placement import bytes_per_block, group_width_bytes
from pagedkv.planning.report import ConcurrencyPoint, GroupReport
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs.base import KVCacheSpec
from pagedkv.specs.full import FullAttentionSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs


def inner_specs(spec: KVCacheSpec) -> list[KVCacheSpec]:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return list(spec.kv_cache_specs.values())
    return [spec]


def group_kind(spec: KVCacheSpec) -> str:
    kinds = {s.kind for s in inner_specs(spec)}
    return kinds.pop() if len(kinds) == 1 else spec.kind


def is_full_attention(spec: KVCacheSpec) -> bool:
    return all(isinstance(s, FullAttentionSpec) for s in inner_specs(spec))


def scheduler_block_size(groups: Sequence[KVCacheGroupSpec], default: int) -> int:
    """Smallest block size among prefix-cacheable groups (all groups if none are)."""
    specs = [g.kv_cache_spec for g in groups if g.layer_names]
    cacheable = [s.block_size for s in specs if s.prefix_cacheable]
    sizes = cacheable or [s.block_size for s in specs]
    return min(sizes, default=default)


def _real_width(group: KVCacheGroupSpec) -> int:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.real_page_size_bytes
    return spec.real_page_size_bytes * len(group.layer_names)


def group_reports(
    groups: Sequence[KVCacheGroupSpec], cost: RequestCost, length: int
) -> list[GroupReport]:
    device_bpb = bytes_per_block(groups)
    host_bpb = bytes_per_block(groups, host=True)
    reports = []
    for gid, group in enumerate(groups):
        bpb = host_bpb if group.host_resident else device_bpb
        width, real = group_width_bytes(group), _real_width(group)
        reports.append(
            GroupReport(
                group_id=gid,
                kind=group_kind(group.kv_cache_spec),
                role=group.role,
                layer_names=group.layer_names,
                block_size=group.kv_cache_spec.block_size,
                page_size_bytes=width,
                real_page_size_bytes=real,
                padding_bytes=width - real,
                unused_slot_bytes=bpb - width,
                waste_bytes=bpb - real,
                waste_fraction=(bpb - real) / bpb if bpb else 0.0,
                blocks_per_request=cost.group_blocks(group.kv_cache_spec, length),
                host_resident=group.host_resident,
            )
        )
    return reports


def request_waste(reports: Sequence[GroupReport]) -> tuple[int, float]:
    """Padding bytes a max-length request holds (per worker slot) and their share."""
    device = [r for r in reports if not r.host_resident]
    waste = sum(r.blocks_per_request * r.waste_bytes for r in device)
    total = sum(r.blocks_per_request * (r.waste_bytes + r.real_page_size_bytes) for r in device)
    return waste, (waste / total if total else 0.0)


def concurrency_point(
    cost: RequestCost, length: int, num_blocks: int, bytes_per_block: int
) -> ConcurrencyPoint:
    blocks = cost.blocks(length)
    if blocks == 0:
        return ConcurrencyPoint(
            context_len=length,
            blocks_per_request=0,
            bytes_per_request=0,
            max_concurrency=None,
            max_requests=None,
            token_capacity=None,
            vllm_max_concurrency=None,
        )
    usable = num_blocks - 1
    concurrency = usable / blocks
    return ConcurrencyPoint(
        context_len=length,
        blocks_per_request=blocks,
        bytes_per_request=blocks * bytes_per_block,
        max_concurrency=concurrency,
        max_requests=usable // blocks,
        token_capacity=usable * length // blocks,
        vllm_max_concurrency=num_blocks / blocks,
    )


def full_attention_token_capacity(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int
) -> int | None:
    """Tokens the usable blocks hold if all go to full-attention groups (None: no such group)."""
    sizes = [
        g.kv_cache_spec.block_size
        for g in groups
        if g.layer_names and not g.host_resident and is_full_attention(g.kv_cache_spec)
    ]
    if not sizes:
        return None
    return int((num_blocks - 1) / sum(1 / bs for bs in sizes))
