"""Planning: grouping layers, placing tensors, memory to block counts."""

from pagedkv.planning.builder import (
    DefaultKVCacheConfigBuilder,
    KVCacheConfigBuilder,
    SupportsKVCacheGrouping,
    VLLMRuleKVCacheConfigBuilder,
    get_kv_cache_config_builder,
)
from pagedkv.planning.plan import plan_kv_cache
from pagedkv.planning.planner import get_kv_cache_configs
from pagedkv.planning.regions import check_aliasing
from pagedkv.planning.report import (
    ConcurrencyPoint,
    GroupingAlternative,
    GroupReport,
    KVCachePlan,
    WorkerReport,
)
from pagedkv.planning.types import (
    DEFAULT_ROLE,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    LayerRegion,
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
