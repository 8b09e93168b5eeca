"""vLLM's ``vllm.v1.core.kv_cache_planning``: its planning entry points, answered by
pagedkv's grouping, placement and planner (``pagedkv.planning``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pagedkv.compat.vllm._outside import outside_function
from pagedkv.compat.vllm.v1.core.kv_cache_config_builder import KVCacheConfigBuilder
from pagedkv.planning import builder as _builder
from pagedkv.planning import placement as _placement
from pagedkv.planning import sizing as _sizing
from pagedkv.planning.grouping import try_merge
from pagedkv.specs import AttentionSpec, KVCacheSpec, UniformTypeKVCacheSpecs

__all__ = [
    "DefaultKVCacheConfigBuilder",
    "get_kv_cache_config_from_groups",
    "get_kv_cache_groups",
    "is_kv_cache_spec_uniform",
    "kv_cache_groups_tp_replicas",
]


def _engine_config(vllm_config: Any) -> Any:
    return (
        vllm_config.to_engine_config() if hasattr(vllm_config, "to_engine_config") else vllm_config
    )


def is_kv_cache_spec_uniform(kv_cache_spec: Mapping[str, KVCacheSpec]) -> bool:
    """Whether every layer's spec merges into one (one group, no uniform-type wrapper)."""
    if not kv_cache_spec:
        return True
    return try_merge(list(kv_cache_spec.values())) is not None


def get_kv_cache_groups(vllm_config: Any, kv_cache_spec: Mapping[str, KVCacheSpec]) -> list[Any]:
    """pagedkv's groups for the layers (vLLM's grouping rule, the default)."""
    builder = _builder.DefaultKVCacheConfigBuilder()
    return builder.get_kv_cache_groups(_engine_config(vllm_config), kv_cache_spec)


def get_kv_cache_config_from_groups(
    vllm_config: Any, kv_cache_groups: Sequence[Any], num_blocks: int, *args: Any
) -> Any:
    return _placement.place_groups(_engine_config(vllm_config), kv_cache_groups, num_blocks)


def kv_cache_groups_tp_replicas(groups: Sequence[Any], tp_size: int, dcp_size: int = 1) -> int:
    """Consecutive TP ranks holding identical KV (pagedkv's ``kv_tp_replicas``). vLLM
    counts a layer without ``max_tp_shards``, or one decode-context-parallel sharded, as
    not replicated, which makes the whole answer 1."""
    for group in groups:
        for spec in _layer_specs(group):
            if not isinstance(spec, AttentionSpec):
                continue
            if spec.max_tp_shards is None or (getattr(spec, "dcp_sharded", False) and dcp_size > 1):
                return 1
    return _sizing.kv_tp_replicas(groups, tp_size)


def _layer_specs(group: Any) -> list[KVCacheSpec]:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return list(spec.kv_cache_specs.values())
    return [spec]


class DefaultKVCacheConfigBuilder(KVCacheConfigBuilder):
    """pagedkv's default builder under vLLM's name."""


_PENDING = "a vLLM planning helper pagedkv.compat.vllm does not translate yet"
for _name in (
    "_get_kv_cache_bytes_per_block",
    "_get_packed_kv_cache_groups",
    "_pool_bytes_per_block",
    "_pool_bytes_per_block_from_builder",
    "_project_kv_cache_groups_to_worker",
    "check_enough_kv_cache_memory",
    "estimate_max_model_len",
    "get_kv_cache_groups_from_builder",
    "get_kv_cache_configs",
):
    globals()[_name] = outside_function(_name, _PENDING, __name__)
