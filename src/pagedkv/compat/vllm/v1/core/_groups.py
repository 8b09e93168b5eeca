"""The default grouping of vLLM layers as vLLM's group objects, below both the
planning entry points and the HiSparse layout that reuses it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagedkv.compat.vllm.config._engine_config import as_engine_config
from pagedkv.compat.vllm.v1 import kv_cache_interface as _iface
from pagedkv.config import EngineConfig
from pagedkv.planning import builder as _builder
from pagedkv.specs import KVCacheSpec, UniformTypeKVCacheSpecs

__all__ = ["engine_config_of", "get_kv_cache_groups", "vllm_group"]


def engine_config_of(vllm_config: Any, **changes: Any) -> EngineConfig:
    """The EngineConfig read off ``vllm_config``, with ``changes`` applied."""
    config: EngineConfig = as_engine_config(vllm_config)
    return config.replace(**changes) if changes else config


def vllm_group(group: Any) -> _iface.KVCacheGroupSpec:
    """A pagedkv group as vLLM's (mutable, list-comparable layer names)."""
    if isinstance(group, _iface.KVCacheGroupSpec):
        return group
    spec = group.kv_cache_spec
    if type(spec) is UniformTypeKVCacheSpecs:  # pagedkv's own: as vLLM's class
        spec = _iface.UniformTypeKVCacheSpecs(
            block_size=spec.block_size, kv_cache_specs=dict(spec.kv_cache_specs)
        )
    return _iface.KVCacheGroupSpec(
        group.layer_names,
        spec,
        is_eagle_group=group.is_eagle_group,
        host_resident=group.host_resident,
        enable_kv_transfer=getattr(group, "enable_kv_transfer", True),
        role=group.role,
    )


def get_kv_cache_groups(
    vllm_config: Any, kv_cache_spec: Mapping[str, KVCacheSpec]
) -> list[_iface.KVCacheGroupSpec]:
    """pagedkv's default grouping (vLLM's rule) for the layers."""
    if not kv_cache_spec:
        return []
    builder = _builder.DefaultKVCacheConfigBuilder()
    groups = builder.choose_kv_cache_groups(engine_config_of(vllm_config), kv_cache_spec).groups
    return [vllm_group(g) for g in groups]
