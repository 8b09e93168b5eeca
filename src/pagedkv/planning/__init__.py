"""Planning: layers into groups (``grouping``, ``pages``), groups into tensors
(``placement``), memory to blocks (``sizing``), the pluggable ``builder``, the
cross-worker ``planner`` and its results (``types``). See docs/ARCHITECTURE.md."""

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
