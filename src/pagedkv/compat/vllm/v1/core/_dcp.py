"""Decode context parallelism: the config pagedkv's manager sees (vLLM's block scaling)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pagedkv.specs import AttentionSpec, UniformTypeKVCacheSpecs

__all__ = ["dcp_kv_cache_config", "dcp_sharded"]


def dcp_kv_cache_config(kv_cache_config: Any, dcp_world_size: int) -> Any:
    """The config the runtime manages under decode context parallelism: a block of a
    DCP-sharded group spans ``block_size * dcp_world_size`` tokens across the ranks (vLLM's
    rule), so its spec gets that block size."""
    if dcp_world_size <= 1:
        return kv_cache_config
    groups = [
        dataclasses.replace(g, kv_cache_spec=_dcp_spec(g.kv_cache_spec, dcp_world_size))
        for g in kv_cache_config.kv_cache_groups
    ]
    return dataclasses.replace(kv_cache_config, kv_cache_groups=groups)


def _dcp_spec(spec: Any, dcp_world_size: int) -> Any:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        layers = {n: _dcp_spec(s, dcp_world_size) for n, s in spec.kv_cache_specs.items()}
        sizes = {s.block_size for s in layers.values()}
        return dataclasses.replace(spec, block_size=sizes.pop(), kv_cache_specs=layers)
    if not dcp_sharded(spec):
        return spec
    return spec.copy_with_new_block_size(spec.block_size * dcp_world_size)


def dcp_sharded(spec: Any) -> bool:
    """Whether decode context parallelism shards the group's blocks across ranks
    (attention kinds unless their spec says otherwise; never Mamba state)."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return all(dcp_sharded(s) for s in spec.kv_cache_specs.values())
    return bool(getattr(spec, "dcp_sharded", isinstance(spec, AttentionSpec)))
