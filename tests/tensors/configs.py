"""Hand-built KV cache configs for the tensor tests (no planner needed)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from pagedkv.specs import KVCacheSpec

GroupLayers = tuple[KVCacheSpec, Sequence[str]]


def layer_outer_config(
    groups: Sequence[GroupLayers], num_blocks: int, *, layout: str = "NHD"
) -> KVCacheConfig:
    """Slot ``i`` (``num_blocks`` pages of the largest page size) is shared by layer ``i``
    of every group; ``block_stride`` is that largest page so block ids line up."""
    page = max(spec.page_size_bytes for spec, _ in groups)
    slots = max(len(names) for _, names in groups)
    size = page * num_blocks * slots
    tensors = [
        KVCacheTensor(
            size=size,
            layers=tuple(names),
            layer_stride=page * num_blocks,
            block_stride=page,
            page_size_bytes=spec.page_size_bytes,
        )
        for spec, names in groups
    ]
    return _config(groups, tensors, num_blocks, layout)


def block_outer_config(
    groups: Sequence[GroupLayers], num_blocks: int, *, layout: str = "NHD"
) -> KVCacheConfig:
    """Each block packs all of a group's layers; every group overlays the same block."""
    bytes_per_block = max(spec.page_size_bytes * len(names) for spec, names in groups)
    tensors = [
        KVCacheTensor(
            size=bytes_per_block * num_blocks,
            layers=tuple(names),
            layer_stride=spec.page_size_bytes,
            block_stride=bytes_per_block,
            page_size_bytes=spec.page_size_bytes,
        )
        for spec, names in groups
    ]
    return _config(groups, tensors, num_blocks, layout)


def _config(
    groups: Sequence[GroupLayers], tensors: list[KVCacheTensor], num_blocks: int, layout: str
) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=tuple(tensors),
        kv_cache_groups=tuple(
            KVCacheGroupSpec(layer_names=tuple(names), kv_cache_spec=spec) for spec, names in groups
        ),
        kv_cache_layout=layout,
    )


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not cuda_available(), reason="no CUDA device"),
    ),
]
