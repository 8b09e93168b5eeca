"""Planning: grouping layers, placing tensors, memory to block counts.

Modules, one concept each: ``types`` (results), ``search`` and ``grouping`` (layers
into groups), ``placement`` (groups into tensors, and the checks on any placement),
``sizing`` (memory to blocks, capacity), ``builder`` (the pluggable builder),
``planner`` (the cross-worker flow and the plan report).
"""

from pagedkv.planning.builder import (
    DefaultKVCacheConfigBuilder,
    KVCacheConfigBuilder,
    SupportsKVCacheGrouping,
    VLLMRuleKVCacheConfigBuilder,
    get_kv_cache_config_builder,
)
from pagedkv.planning.placement import check_aliasing
from pagedkv.planning.planner import get_kv_cache_configs, plan_kv_cache
from pagedkv.planning.types import (
    DEFAULT_ROLE,
    ConcurrencyPoint,
    GroupingAlternative,
    GroupReport,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCachePlan,
    KVCacheTensor,
    LayerRegion,
    WorkerReport,
)

__all__ = [
    "DEFAULT_ROLE",
    "ConcurrencyPoint",
    "DefaultKVCacheConfigBuilder",
    "GroupReport",
    "GroupingAlternative",
    "KVCacheConfig",
    "KVCacheConfigBuilder",
    "KVCacheGroupSpec",
    "KVCachePlan",
    "KVCacheTensor",
    "LayerRegion",
    "SupportsKVCacheGrouping",
    "VLLMRuleKVCacheConfigBuilder",
    "WorkerReport",
    "check_aliasing",
    "get_kv_cache_config_builder",
    "get_kv_cache_configs",
    "plan_kv_cache",
]
